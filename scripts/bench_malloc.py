#!/usr/bin/env python
"""Training steps with and without the malloc tuning (dpr/perf/malloc.py), in alternating processes.

The peer is our own trainer with glibc's default malloc (``DPR_MALLOC_TUNING=0``, the behaviour before the
tuning existed); the setting is per process, so each run is its own ``dpr-train`` process, and the runs
alternate (tuned, default, tuned, ...) so load drift on a shared machine hits both alike. Each run trains
``--steps`` two-tower steps of the pipeline's recipe from the same weights and seed (same batches, same
precision); the row's rate is questions per second from the median step time (the first step left out),
with the run's peak RSS (``wait4``) and its last loss (equal on both sides: the tuning changes no number).

    DPR_DATA_MIRROR=../shared/data .venv/bin/python scripts/bench_malloc.py --json bench_malloc.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from script_args import OneLineParser, json_output, whole  # scripts/ is on sys.path

REPO = Path(__file__).resolve().parents[1]
SYSTEMS = {"ours": "1", "glibc-default": "0"}  # system -> DPR_MALLOC_TUNING


def parse_args(doc: str, argv: list[str] | None) -> argparse.Namespace:
    """The options of a bench of ``dpr-train`` processes (this one and ``bench_length_buckets.py``)."""
    ap = OneLineParser(description=doc.split("\n\n")[0])
    ap.add_argument("--data", default="squad1_open")
    ap.add_argument("--data-dir", default=str(REPO / "data" / "prepared"))
    ap.add_argument("--steps", type=whole(2), default=8)
    ap.add_argument("--batch-size", type=whole(1), default=32)
    ap.add_argument("--rounds", type=whole(1), default=2, help="runs per system, alternating")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--extra", nargs="*", default=[], help="more dpr-train overrides (tests: a tiny model)")
    ap.add_argument("--json", type=json_output, default=None)
    return ap.parse_args(argv)


def run_once(setting: str, out: Path, args: argparse.Namespace, overrides: tuple[str, ...] = ()) -> dict:
    """One ``dpr-train`` process of ``--steps`` two-tower steps with ``DPR_MALLOC_TUNING=setting`` (and
    ``overrides``): its per-step seconds, median (first step left out), last loss and peak RSS."""
    cmd = [str(Path(sys.executable).parent / "dpr-train"), f"data={args.data}", f"data_dir={args.data_dir}",
           "train=pipeline", "train.frozen_steps=0", f"train.max_steps={args.steps}", "train.validate=false",
           "train.validate_at_start=false", "train.save_every=0", f"train.batch_size={args.batch_size}",
           f"train.precision={args.precision}", f"output_dir={out}", *args.extra, *overrides]
    env = {**os.environ, "DPR_MALLOC_TUNING": setting, "WANDB_MODE": "disabled"}
    out.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"
    with open(log, "w") as log_f:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log_f)
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak RSS
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{log.read_text()[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = [args.batch_size / r["examples_per_s"] for r in rows]
    return {"step_s": [round(s, 3) for s in seconds], "median_s": statistics.median(seconds[1:]),
            "loss": rows[-1]["loss"], "maxrss_gb": round(usage.ru_maxrss / 1e6, 2)}


def system_rows(runs: dict[str, list[dict]], args: argparse.Namespace, **extra: dict) -> list[dict]:
    """One report row per system from its runs: questions/s at the median of their median step times, the
    largest peak RSS, the last loss; ``extra`` maps a column name to each system's value."""
    from dpr.perf.report import row

    rows = []
    for name, results in runs.items():
        median = statistics.median(r["median_s"] for r in results)
        rows.append(row(name, args.precision, args.batch_size / median, median_step_s=round(median, 3),
                        maxrss_gb=max(r["maxrss_gb"] for r in results), loss=results[-1]["loss"],
                        **{k: v[name] for k, v in extra.items()}, runs=results))
    return rows


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(__doc__, argv)

    from dpr.perf.report import bench_report

    runs: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, setting in SYSTEMS.items():
                res = run_once(setting, Path(tmp) / f"{name}_{r}", args)
                runs[name].append(res)
                print(f"{name} run {r + 1}: median step {res['median_s']:.2f} s, peak RSS {res['maxrss_gb']} GB",
                      flush=True)
    rows = system_rows(runs, args)
    report = bench_report(rows, peer="glibc-default", ours_default=args.precision, peaks={}, peer_default=args.precision,
                          same_loss=len({r["loss"] for r in rows}) == 1, steps=args.steps, batch_size=args.batch_size)
    print(f"ours / glibc-default: {report['ratio']['best']}x questions/s ({args.precision}); "
          f"same loss: {report['same_loss']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
