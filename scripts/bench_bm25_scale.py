#!/usr/bin/env python
"""BM25 at growing corpus sizes: build memory (sharded against one-shot), per-query CPU time (the compiled
top k of `dpr.bm25.search_indices` against dense scoring of every passage), and search throughput on 1
against 2 threads; growth laws, the projection to DPR's 21,015,324 Wikipedia passages, and what mining NQ's
training and dev questions would take there.

    nice .venv/bin/python scripts/bench_bm25_scale.py --sizes 200000,1000000 --json runs/bm25_scale.json

The corpus at each size is squad1_open's real passages at seeded random rows among synthetic ones with
the real word distribution and passage lengths (`scale_synth.PassageSampler`), written once as a
passages.tsv under ``--work``. Each build runs in its own process, from the file (the texts never sit in
memory), and its peak is the anonymous RSS above the level before the build (`scale_stats.PeakRSS`;
memory-mapped shard files are page cache, not counted). Queries: the dataset's real questions.

- per-query CPU: ``time.process_time`` of one thread over ``--queries`` questions at ``--k``: the search
  (`dpr.bm25.search_indices`: the query terms' postings added into a per-passage accumulator by compiled
  loops, the top k picked from it; `dpr.bm25.kernels`) on the one-shot and on the sharded index, against
  the dense scoring it replaces (every passage scored with ``np.bincount``, ``max(1, 2^19 // N)`` queries a
  batch, then ``argpartition``), on the same index in the same run. A warm-up search first, so the kernels'
  one-time compile or cache load is not counted. Where there is a one-shot index, the peer library's own
  compiled search too: bm25s with ``backend="numba"`` (one thread), and the share of queries where its top k
  is the same set of passages.
- mining projection: the sharded search's per-query CPU projected to 21M by its growth law, times NQ's
  ``--mine-questions`` training and dev questions, over ``--mine-cores`` cores (threads scaling as measured).
- threads: wall time of `search_indices` over ``--thread-queries`` questions with 1 and with 2 threads
  (interleaved, best of ``--repeat``): the search that BM25 mining runs, at the mining depth.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TQDM_DISABLE", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_stats import PeakRSS, growth_table  # noqa: E402

log = logging.getLogger("bench_bm25_scale")
TARGET = 21_015_324
CHUNK = 50_000  # synthetic passages drawn (and written) at a time


def write_corpus(real_root: Path, n: int, out: Path, seed: int) -> Path:
    """``n`` passages: the real ones at seeded random rows, synthetic ones elsewhere; written once."""
    from scale_synth import PassageSampler

    from dpr.data.passages import iter_passages, write_passages

    if out.is_file():
        return out
    real = list(iter_passages(real_root / "passages.tsv"))
    sampler = PassageSampler([r["text"] for r in real], [r["title"] for r in real], seed=seed)
    rng = np.random.default_rng(seed + n)
    real_at = dict(zip(rng.choice(n, size=min(n, len(real)), replace=False).tolist(), real))

    def rows():
        for start in range(0, n, CHUNK):
            texts, titles = sampler.sample(min(CHUNK, n - start))
            for j, (text, title) in enumerate(zip(texts, titles)):
                i = start + j
                yield real_at.get(i) or {"id": f"syn{i}", "text": text, "title": title}

    out.parent.mkdir(parents=True, exist_ok=True)
    write_passages(out, rows())
    return out


def child_build(passages: Path, shard_passages: int, index_dir: Path) -> dict:
    """One build from the file, in this (fresh) process; saved for the search measurements."""
    from dpr import bm25

    with PeakRSS() as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        index = bm25.build_index(passages, shard_passages=shard_passages)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    bm25.save_index(index, index_dir)
    return {"build_s": wall, "build_cpu_s": cpu, "peak_rss_bytes": mem.peak_delta,
            "shards": len(index.postings()), "passages": len(index)}


def run_build(passages: Path, shard_passages: int, index_dir: Path) -> dict:
    """A build in a fresh process; its figures are kept beside the index, which a later run reuses."""
    record = index_dir.with_name(index_dir.name + ".build.json")
    if record.is_file() and (index_dir / "dpr_bm25.json").is_file():
        return json.loads(record.read_text())
    cmd = [sys.executable, __file__, "--child-build", str(passages), "--shard-passages", str(shard_passages),
           "--index-dir", str(index_dir)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    record.write_text(json.dumps(res) + "\n")
    return res


def dense_top(index, token_ids, k: int):
    """The dense scoring the posting-list search replaces: every passage scored, then argpartition."""
    from dpr.bm25.search import score_matrix

    n = len(index)
    batch = int(max(1, min(256, (1 << 19) // n)))
    for s in range(0, len(token_ids), batch):
        scores = score_matrix(index, token_ids[s:s + batch])
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        top_scores = np.take_along_axis(scores, top, axis=1)
        np.take_along_axis(top, np.lexsort((top, -top_scores), axis=1), axis=1)


def bm25s_numba(index, token_ids, k: int) -> tuple[float, np.ndarray]:
    """The peer: bm25s' own compiled retrieval (``backend="numba"``, one thread) on the one-shot index: its CPU
    ms per query and its top-k rows."""
    retriever = index.retriever
    retriever.backend = "numba"
    retriever.retrieve(token_ids[:8], k=k, n_threads=1, show_progress=False)  # compile
    c0 = time.process_time()
    docs, _ = retriever.retrieve(token_ids, k=k, n_threads=1, show_progress=False)
    return 1e3 * (time.process_time() - c0) / len(token_ids), np.asarray(docs)


def cpu_per_query(fn, n_queries: int) -> float:
    c0 = time.process_time()
    fn()
    return (time.process_time() - c0) / n_queries


def measure_search(one_dir: Path | None, sharded_dir: Path, questions: list[str], args: argparse.Namespace) -> dict:
    from dpr import bm25
    from dpr.bm25.search import _query_token_ids

    sharded = bm25.load_index(sharded_dir)
    # above --one-shot-max there is no one-shot index: the dense scoring runs over the sharded one's postings
    one = bm25.load_index(one_dir) if one_dir is not None else sharded
    qs = questions[: args.queries]
    tokens = _query_token_ids(one, qs)
    k = args.k
    for index in {id(one): one, id(sharded): sharded}.values():  # compile or load the kernels; map the lists
        bm25.search_indices(index, qs[:8], k=k, n_threads=0, show_progress=False)
    res = {
        "dense_cpu_ms": 1e3 * cpu_per_query(lambda: dense_top(one, tokens, k), len(qs)),
        "postings_cpu_ms": 1e3 * cpu_per_query(
            lambda: bm25.search_indices(one, qs, k=k, n_threads=0, show_progress=False), len(qs)),
        "postings_sharded_cpu_ms": 1e3 * cpu_per_query(
            lambda: bm25.search_indices(sharded, qs, k=k, n_threads=0, show_progress=False), len(qs)),
    }
    a = bm25.search_indices(one, qs, k=k, n_threads=0, show_progress=False)
    if one_dir is not None:
        res["bm25s_numba_cpu_ms"], docs = bm25s_numba(one, tokens, k)
        # the same passages; the order within ties (and so the k-th place) may differ
        res["bm25s_numba_same_top_k"] = float(np.mean([set(x) == set(y) for x, y in zip(docs.tolist(),
                                                                                      a[0].tolist())]))
    b = bm25.search_indices(sharded, qs, k=k, n_threads=0, show_progress=False)
    res["sharded_equals_one_shot"] = bool(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))
    tq = (questions * (args.thread_queries // max(1, len(questions)) + 1))[: args.thread_queries]
    best = {1: float("inf"), 2: float("inf")}
    for _ in range(args.repeat):
        for threads in (1, 2):
            t0 = time.perf_counter()
            bm25.search_indices(one, tq, k=k, n_threads=threads, show_progress=False)
            best[threads] = min(best[threads], time.perf_counter() - t0)
    res["threads_qps"] = {str(t): len(tq) / s for t, s in best.items()}
    res["threads_speedup"] = best[1] / best[2]
    return res


def mining_projection(growth: dict, results: list[dict], args: argparse.Namespace) -> dict:
    """Hours to mine ``--mine-questions`` questions against 21M passages on ``--mine-cores`` cores: the sharded
    search's per-query CPU at the largest size carried to 21M by its growth law, or linearly if the law is
    flatter (the conservative of the two), with the 2-thread speed-up measured there taken as the per-core
    efficiency."""
    last = results[-1]
    law = growth["postings_sharded_cpu_ms"]["exponent"] or 1.0
    per_query_ms = last["postings_sharded_cpu_ms"] * (TARGET / last["passages"]) ** max(1.0, law)
    efficiency = last["threads_speedup"] / 2
    hours = args.mine_questions * per_query_ms / 1e3 / (args.mine_cores * efficiency) / 3600
    return {"questions": args.mine_questions, "cores": args.mine_cores, "per_query_ms_at_target": per_query_ms,
            "core_efficiency": efficiency, "hours": hours}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="200000,1000000")
    ap.add_argument("--shard-passages", type=int, default=100_000, help="the sharded builds' shard size")
    ap.add_argument("--data-dir", default=str(REPO / "data" / "prepared"))
    ap.add_argument("--dataset", default="squad1_open")
    ap.add_argument("--work", default="/tmp/bench_bm25_scale", help="corpora and indexes (reused)")
    ap.add_argument("--one-shot-max", type=int, default=1_000_000,
                    help="no one-shot build above this size (its memory grows with N)")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--thread-queries", type=int, default=2000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mine-questions", type=int, default=58_880 + 6_515, help="NQ's training and dev questions")
    ap.add_argument("--mine-cores", type=int, default=32)
    ap.add_argument("--json")
    ap.add_argument("--child-build", help=argparse.SUPPRESS)
    ap.add_argument("--index-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_build:
        print(json.dumps(child_build(Path(args.child_build), args.shard_passages, Path(args.index_dir))))
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from bench_bm25 import load_questions
    from bench_data import find_dataset

    root = find_dataset(Path(args.data_dir), args.dataset, prefix="bench_bm25_scale_")
    questions = load_questions(root)
    work = Path(args.work)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    for n in sizes:
        corpus = write_corpus(root, n, work / f"n{n}" / "passages.tsv", args.seed)
        one_dir = work / f"n{n}" / "one_shot" if n <= args.one_shot_max else None
        row = {"passages": n,
               "one_shot": run_build(corpus, n, one_dir) if one_dir is not None else None,
               "sharded": run_build(corpus, args.shard_passages, work / f"n{n}" / "sharded")}
        row.update(measure_search(one_dir, work / f"n{n}" / "sharded", questions, args))
        log.info("%s", json.dumps(row))
        results.append(row)
    series = {
        "build_peak_one_shot": [r["one_shot"]["peak_rss_bytes"] if r["one_shot"] else None for r in results],
        "build_peak_sharded": [r["sharded"]["peak_rss_bytes"] for r in results],
        "build_s_sharded": [r["sharded"]["build_s"] for r in results],
        "dense_cpu_ms": [r["dense_cpu_ms"] for r in results],
        "postings_cpu_ms": [r["postings_cpu_ms"] for r in results],
        "postings_sharded_cpu_ms": [r["postings_sharded_cpu_ms"] for r in results],
    }
    growth = growth_table(sizes, series, TARGET)
    out = {"sizes": sizes, "shard_passages": args.shard_passages, "k": args.k, "results": results,
           "growth": growth, "cpu": os.cpu_count(), "mining": mining_projection(growth, results, args)}
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
