"""Top-k search returning passage ids, in query batches with progress."""

from __future__ import annotations

import logging

import faiss
import numpy as np
from tqdm.auto import tqdm

from dpr.checks import MAX_BATCH, MAX_K, check_int

log = logging.getLogger(__name__)


def search(index: faiss.Index, ids: list[str], queries: np.ndarray, k: int,
           batch_size: int = 1024, progress: bool = True) -> tuple[list[list[str]], np.ndarray]:
    """The top ``k`` passage ids per query (best first) and their scores, higher = better.

    Scores are inner products for IP indexes and negated squared distances for L2 indexes, so callers
    never need to know the metric. ``k`` is capped at the index size; slots faiss leaves empty (-1,
    e.g. an IVF probe that found fewer than k) are dropped from the id lists and scored ``-inf``.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if queries.ndim != 2 or queries.shape[1] != index.d:
        raise ValueError(f"queries must be [n, {index.d}], got {list(queries.shape)}")
    k = min(check_int("k", k, 1, MAX_K), int(index.ntotal))
    batch_size = check_int("search_batch_size", batch_size, 1, MAX_BATCH)
    n = queries.shape[0]
    scores = np.full((n, max(k, 0)), -np.inf, dtype=np.float32)
    labels = np.full((n, max(k, 0)), -1, dtype=np.int64)
    if k > 0:
        for start in tqdm(range(0, n, batch_size), desc="search", unit="batch", disable=not progress):
            D, I = index.search(queries[start:start + batch_size], k)
            scores[start:start + len(D)] = D
            labels[start:start + len(I)] = I
        if index.metric_type == faiss.METRIC_L2:
            scores = -scores
        scores[labels < 0] = -np.inf
    hits = [[ids[j] for j in row if j >= 0] for row in labels]
    short = sum(len(row) < k for row in hits)
    if short:  # IVF: the probed lists hold fewer than k vectors. Said, never silent.
        log.warning("%d of %d queries got fewer than k=%d passages (an IVF index probing too few lists: raise "
                    "nprobe)", short, n, k)
    return hits, scores
