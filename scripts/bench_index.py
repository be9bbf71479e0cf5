#!/usr/bin/env python
"""FAISS index benchmark: flat search against numpy brute force, and what IVF-PQ / HNSW cost in accuracy.

    .venv/bin/python scripts/bench_index.py                          # 20k seeded random vectors (short)
    .venv/bin/python scripts/bench_index.py --embeddings runs/squad1_open/dense/embeddings \\
        --model runs/squad1_open/model --qa data/prepared/squad1_open/test.qa.tsv \\
        --passages data/prepared/squad1_open/passages.tsv               # real vectors, top-20 accuracy

1. Flat (exact inner product, `dpr.index.build_index`) vs numpy ``Q @ X.T`` + argpartition on the same
   vectors and queries: time per query and whether the top-k ids agree.
2. IVF-PQ (``IVF{nlist},PQ{m}``, ``--nprobe``) and HNSW32, built through `dpr.index.build_and_save`:
   bytes per passage (index file / passages), build time, query time, and the accuracy cost against
   flat — top-k accuracy (has_answer) with real questions (``--qa`` + ``--model`` + ``--passages``),
   else the recall@k proxy: the share of flat's top k that the approximate index also returns.

Without ``--embeddings`` the vectors are a seeded Gaussian mixture (``--clusters`` centres, unit
norm, like sentence embeddings) written as shards, and queries are noisy copies of random passages.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from script_args import OneLineParser, input_dir, input_file, json_output, whole  # scripts/ is on sys.path

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

log = logging.getLogger("bench_index")


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def synthetic(n: int, dim: int, clusters: int, n_queries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    x = unit(centres[rng.integers(0, clusters, n)] + 0.6 * rng.standard_normal((n, dim)).astype(np.float32))
    q = unit(x[rng.integers(0, n, n_queries)] + 0.6 * rng.standard_normal((n_queries, dim)).astype(np.float32))
    return x, q


def numpy_topk(x: np.ndarray, q: np.ndarray, k: int, batch: int = 256) -> np.ndarray:
    out = np.empty((len(q), k), dtype=np.int64)
    for s in range(0, len(q), batch):
        sims = q[s:s + batch] @ x.T
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, part, axis=1), axis=1, kind="stable")
        out[s:s + batch] = np.take_along_axis(part, order, axis=1)
    return out


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> None:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embeddings", type=input_dir, help="a dpr-encode output directory (default: synthetic vectors)")
    ap.add_argument("--n", type=whole(1), default=20_000, help="synthetic passages")
    ap.add_argument("--dim", type=whole(1), default=384, help="synthetic dimension (MiniLM: 384)")
    ap.add_argument("--clusters", type=whole(1), default=200)
    ap.add_argument("--queries", type=whole(1), default=500)
    ap.add_argument("--k", type=whole(1), default=20)
    ap.add_argument("--nprobe", type=whole(1), default=16)
    ap.add_argument("--ef-search", type=whole(1), default=128)
    ap.add_argument("--model", help="encode --qa questions with this model (real top-k accuracy)")
    ap.add_argument("--qa", type=input_file, help="questions + answers (.qa.tsv) for top-k accuracy")
    ap.add_argument("--passages", type=input_file, help="passages.tsv the embeddings were encoded from")
    ap.add_argument("--seed", type=whole(0), default=0)
    ap.add_argument("--json", type=json_output, help="also write the numbers here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from dpr.index import build_and_save, build_index, load_index, search
    from dpr.index.shards import list_shards, write_shard

    tmp = Path(tempfile.mkdtemp(prefix="bench_index_"))
    pairs = None
    if args.embeddings:
        emb = args.embeddings
        shards = list_shards(emb)
        x = np.concatenate([np.asarray(s.vectors(), dtype=np.float32) for s in shards])
        if args.qa and args.model:
            from dpr.data.questions import read_questions
            from dpr.retrieval.runs import encode_questions

            pairs = read_questions(args.qa)[: args.queries]
            q, _ = encode_questions(args.model, [p[0] for p in pairs])
        else:
            rng = np.random.default_rng(args.seed)
            q = x[rng.integers(0, len(x), args.queries)]
            q = (q + 0.1 * np.abs(q).mean() * rng.standard_normal(q.shape)).astype(np.float32)
    else:
        x, q = synthetic(args.n, args.dim, args.clusters, args.queries, args.seed)
        emb = tmp / "emb"
        for s, part in enumerate(np.array_split(np.arange(len(x)), 4)):
            write_shard(emb, s, 4, x[part], [f"d{i}" for i in part], model="synthetic", normalized=True)
    n, dim, k = len(x), x.shape[1], args.k
    report: dict = {"n": n, "dim": dim, "queries": len(q), "k": k, "data": str(args.embeddings or "synthetic")}

    # 1. flat vs numpy brute force
    index, ids = build_index(emb)
    t_flat, (flat_hits, _) = timed(lambda: search(index, ids, q, k, progress=False))
    t_np, np_top = timed(lambda: numpy_topk(x, q, k))
    row_of = {pid: i for i, pid in enumerate(ids)}
    flat_rows = np.array([[row_of[p] for p in hits] for hits in flat_hits])
    report["flat_ms_per_query"] = round(1000 * t_flat / len(q), 3)
    report["numpy_ms_per_query"] = round(1000 * t_np / len(q), 3)
    report["flat_vs_numpy_same_ids"] = round(float((flat_rows == np_top).all(axis=1).mean()), 4)
    report["flat_vs_numpy_same_sets"] = round(float(np.mean([set(a) == set(b) for a, b in zip(flat_rows, np_top)])), 4)

    # 2. approximate indexes against flat
    flat_meta = build_and_save(emb, tmp / "flat.faiss")
    report["flat_bytes_per_passage"] = flat_meta["bytes_per_passage"]
    configs = {
        "ivfpq": dict(factory="IVF{nlist},PQ{m}", nprobe=args.nprobe),
        "hnsw": dict(factory="HNSW32", ef_construction=200, ef_search=args.ef_search),
    }
    answers_hit = None
    if pairs is not None and args.passages:
        from dpr.eval.has_answer import has_answer
        from dpr.retrieval.passages import fetch_passages

        def top_k_accuracy(hits: list[list[str]]) -> float:
            texts = fetch_passages(args.passages, [p for h in hits for p in h])
            return float(np.mean([any(has_answer(a, texts[p]["text"]) for p in h) for (_, a), h in zip(pairs, hits)]))

        answers_hit = top_k_accuracy
        report[f"flat_top{k}"] = round(top_k_accuracy(flat_hits), 4)
    for name, params in configs.items():
        t_build, meta = timed(lambda: build_and_save(emb, tmp / f"{name}.faiss", **params))
        idx, idx_ids = load_index(tmp / f"{name}.faiss", nprobe=params.get("nprobe"), ef_search=params.get("ef_search"))
        t_search, (hits, _) = timed(lambda: search(idx, idx_ids, q, k, progress=False))
        recall = np.mean([len(set(h) & set(f)) / k for h, f in zip(hits, flat_hits)])
        report[name] = {
            "factory": meta["factory"], "bytes_per_passage": meta["bytes_per_passage"],
            "build_s": round(t_build, 2), "ms_per_query": round(1000 * t_search / len(q), 3),
            f"recall@{k}_vs_flat": round(float(recall), 4),
        }
        if answers_hit is not None:
            report[name][f"top{k}"] = round(answers_hit(hits), 4)
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
