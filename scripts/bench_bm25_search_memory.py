#!/usr/bin/env python
"""The memory a BM25 search process holds over a sharded index, with and without the index's record that its
posting rows ascend (``rows_ascend`` in ``dpr_bm25.json``): without it, search first checks every posting list,
which maps every page of the index's ``indices`` files into the process.

    nice .venv/bin/python scripts/bench_bm25_search_memory.py /tmp/bbs_fresh/n1000000/sharded --queries 2000

The two variants share the same shard files (a copy of the index directory whose files are symlinks, with its own
``dpr_bm25.json``), and each search runs in a fresh process: ``load_index`` then `dpr.bm25.search_indices` of the
dataset's first ``--queries`` real questions (repeated if it has fewer) at ``--k``, one thread. Reported: the peak
VmRSS, RssAnon and RssFile while it ran (`scale_stats.StatusPeaks`), its wall time, and a hash of the rows found,
which must be equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_stats import StatusPeaks  # noqa: E402

META = "dpr_bm25.json"


def variant(index_dir: Path, out: Path, record: bool) -> Path:
    """``out``: ``index_dir``'s files as symlinks, and a meta file with or without the record."""
    out.mkdir(parents=True, exist_ok=True)
    for f in index_dir.iterdir():
        if f.name != META:
            link = out / f.name
            if link.is_symlink():  # made for another index by an earlier run in the same work directory
                link.unlink()
            link.symlink_to(f.resolve())
    meta = json.loads((index_dir / META).read_text())
    meta.pop("rows_ascend", None)
    if record:
        meta["rows_ascend"] = True
    (out / META).write_text(json.dumps(meta))
    return out


def child(index_dir: Path, questions: list[str], k: int) -> dict:
    from dpr import bm25

    with StatusPeaks() as peaks:
        t0 = time.perf_counter()
        index = bm25.load_index(index_dir)
        rows, _ = bm25.search_indices(index, questions, k=k, n_threads=0, show_progress=False)
        wall = time.perf_counter() - t0
    return {"rows_ascend_recorded": index.rows_ascend, "wall_s": round(wall, 2),
            "peak_bytes": peaks.peak, "rows_sha256": hashlib.sha256(rows.tobytes()).hexdigest()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("index_dir")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--data-dir", default=str(REPO / "data" / "prepared"))
    ap.add_argument("--dataset", default="squad1_open")
    ap.add_argument("--work", default="/tmp/bench_bm25_search_memory")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from bench_bm25 import load_questions
    from bench_data import find_dataset

    questions = load_questions(find_dataset(Path(args.data_dir), args.dataset, prefix="bench_bm25_mem_"))
    questions = (questions * (args.queries // len(questions) + 1))[: args.queries]
    if args.child:
        print(json.dumps(child(Path(args.child), questions, args.k)))
        return
    index_dir, work = Path(args.index_dir), Path(args.work)
    results = {}
    for name, record in (("without_record", False), ("with_record", True)):
        d = variant(index_dir, work / name, record)
        cmd = [sys.executable, __file__, str(index_dir), "--queries", str(args.queries), "--k", str(args.k),
               "--data-dir", args.data_dir, "--dataset", args.dataset, "--child", str(d)]
        results[name] = json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
                                   .strip().splitlines()[-1])
    same = results["with_record"]["rows_sha256"] == results["without_record"]["rows_sha256"]
    print(json.dumps({"index": str(index_dir), "queries": args.queries, "k": args.k, "same_rows": same,
                      **results}, indent=2))
    if not same:
        sys.exit("the two searches found different rows")


if __name__ == "__main__":
    main()
