#!/usr/bin/env python
"""Dense retrieval's peak memory against its index's own size, at corpus sizes up to 5M passages.

    nice -n 10 .venv/bin/python scripts/scale_retrieval.py --sizes 1000000,5000000 --json runs/scale_retrieval.json

At each size N: N Gaussian unit vectors at the tiny model's 32 dimensions (float16 shards, as `dpr-encode` writes
them) are indexed flat (`dpr.index.build_and_save`); then, in a fresh process each, `DenseRetriever` loads the
index and retrieves the top 100 for squad1_open's test questions (``--qa``), twice: as `dpr.index.load_index` keeps
ids now (`dpr.index.shards.IdList`: one buffer and offsets) and, the named peer, as a list of Python strings (the
earlier `read_ids`). Reported: the index file's size, the process's peak RSS (VmRSS, sampled every 20 ms, from
start to the last search) and the peak minus the index size.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_pipeline import tiny_model  # noqa: E402
from scale_stats import StatusPeaks  # noqa: E402

log = logging.getLogger("scale_retrieval")


def write_corpus(out: Path, n: int, dim: int, model: Path, seed: int) -> None:
    """One float16 shard of ``n`` unit Gaussian vectors with ids ``syn<i>``, recorded as ``model``'s."""
    from dpr.index.fingerprint import model_fingerprint
    from dpr.index.shards import ShardFiles, commit_shard

    out.mkdir(parents=True, exist_ok=True)
    files = ShardFiles.of(out, 0, 1)
    tmp_v, tmp_i = out / ".v.npy.tmp", out / ".i.txt.tmp"
    arr = np.lib.format.open_memmap(tmp_v, mode="w+", dtype=np.float16, shape=(n, dim))
    rng = np.random.default_rng(seed)
    with open(tmp_i, "w", encoding="utf-8") as f:
        for a in range(0, n, 1_000_000):
            b = min(a + 1_000_000, n)
            x = rng.standard_normal((b - a, dim), dtype=np.float32)
            arr[a:b] = x / np.linalg.norm(x, axis=1, keepdims=True)
            f.write("".join(f"syn{i}\n" for i in range(a, b)))
    arr.flush()
    del arr
    commit_shard(files, tmp_v, tmp_i, {"format": _format(), "shard_id": 0, "num_shards": 1, "start": 0, "end": n,
                                       "total": n, "count": n, "dim": dim, "dtype": "float16", "normalized": False,
                                       "model": str(model), "model_fingerprint": model_fingerprint(model),
                                       "passages_sha256": "sha256:synthetic"})


def _format() -> str:
    from dpr.index.shards import FORMAT

    return FORMAT


def run_one(args: argparse.Namespace) -> None:
    """Load and search in this process; peak VmRSS from before the load to after the last search."""
    from dpr.data.questions import read_questions
    from dpr.index import storage
    from dpr.index.shards import read_ids
    from dpr.retrieval.retriever import DenseRetriever

    if args.ids_as_strings:  # the named peer: every id a Python string
        storage.IdList.read = staticmethod(read_ids)  # type: ignore[method-assign]
    questions = [q for q, _ in read_questions(args.qa)]
    with StatusPeaks(("VmRSS", "RssAnon")) as peak:
        t0 = time.perf_counter()
        retriever = DenseRetriever(args.model, args.index, None, index_device="cpu")
        ranked = retriever.search_ids(questions, k=100)
        seconds = time.perf_counter() - t0
    assert len(ranked) == len(questions)
    Path(args.json).write_text(json.dumps({"peak_rss_bytes": peak.peak["VmRSS"], "peak_anon_bytes": peak.peak["RssAnon"],
                                           "seconds": seconds, "questions": len(questions)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,5000000")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--qa", type=Path, default=REPO / "data" / "prepared" / "squad1_open" / "test.qa.tsv")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ids-as-strings", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--index", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.one:
        return run_one(args)
    from dpr.atomic import write_json_atomic
    from dpr.index import build_and_save

    work = args.work or Path(tempfile.mkdtemp(prefix="scale_retrieval_"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    results: dict = {"commit": commit, "sizes": {}}
    try:
        model = tiny_model(work / "tiny_model")
        for n in sorted({int(s) for s in args.sizes.split(",")}):
            emb, index = work / f"emb{n}", work / f"index{n}.faiss"
            if not index.is_file():
                write_corpus(emb, n, 32, model, args.seed)
                build_and_save(emb, index, factory="Flat")
            row = {"index_bytes": index.stat().st_size}
            for mode in ("id_buffer", "ids_as_strings"):
                part = work / f"r{n}_{mode}.json"
                cmd = [sys.executable, __file__, "--one", "--json", str(part), "--qa", str(args.qa), "--model",
                       str(model), "--index", str(index), *(["--ids-as-strings"] if mode == "ids_as_strings" else [])]
                subprocess.run(cmd, check=True)
                m = json.loads(part.read_text())
                m["over_index_bytes"] = m["peak_rss_bytes"] - row["index_bytes"]
                row[mode] = m
                log.info("%d passages, %s: %s", n, mode, m)
            results["sizes"][str(n)] = row
            write_json_atomic(args.json, results)
            shutil.rmtree(emb, ignore_errors=True)
        for n, row in results["sizes"].items():
            mib = lambda b: f"{b / 2**20:,.0f} MiB"  # noqa: E731
            print(f"{int(n):,}: index {mib(row['index_bytes'])}; peak RSS {mib(row['id_buffer']['peak_rss_bytes'])} "
                  f"(+{mib(row['id_buffer']['over_index_bytes'])}) vs ids as strings "
                  f"{mib(row['ids_as_strings']['peak_rss_bytes'])} (+{mib(row['ids_as_strings']['over_index_bytes'])})")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
