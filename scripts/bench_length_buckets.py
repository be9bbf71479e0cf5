#!/usr/bin/env python
"""Two-tower training steps with length-sorted buckets against one padded forward, alternating processes.

The peer is our own trainer encoding each tower's batch in one forward padded to its longest text
(``train.length_bucket_size=0``, the behaviour before buckets existed); ours encodes length-sorted buckets
of 8 rows (the default) and of 16. Each run is its own ``dpr-train`` process of ``--steps`` two-tower steps
of the pipeline's recipe from the same weights, seed and batches, the systems alternating so load drift on a
shared machine hits all alike (``scripts/bench_malloc.py``'s protocol and runner). The row's rate is
questions per second from the median step time (the first step left out), with peak RSS and the last loss:
the losses differ in the last digits only through rounding and dropout masks drawn per bucket.

    DPR_DATA_MIRROR=../shared/data .venv/bin/python scripts/bench_length_buckets.py --json bench_buckets.json
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from bench_malloc import parse_args, run_once, system_rows

SYSTEMS = {"ours": 8, "ours-buckets16": 16, "one-padded-forward": 0}  # system -> length_bucket_size


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)

    from dpr.perf.report import bench_report

    runs: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for k, (name, size) in enumerate(SYSTEMS.items()):
                res = run_once("1", Path(tmp) / f"s{k}_{r}", args, (f"train.length_bucket_size={size}",))
                runs[name].append(res)
                print(f"{name} run {r + 1}: median step {res['median_s']:.2f} s, loss {res['loss']:.4f}, "
                      f"peak RSS {res['maxrss_gb']} GB", flush=True)
    rows = system_rows(runs, args, bucket_size=SYSTEMS)
    report = bench_report(rows, peer="one-padded-forward", ours_default=args.precision, peaks={},
                          peer_default=args.precision, steps=args.steps, batch_size=args.batch_size)
    print(f"ours (buckets of 8) / one padded forward: {report['ratio']['best']}x questions/s ({args.precision})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
