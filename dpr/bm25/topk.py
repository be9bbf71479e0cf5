"""BM25 top k from the query terms' posting lists only: the work per query is the number of postings it
touches, not the number of passages.

A query's score of a passage is the sum of its terms' weights there. The weights of each term's posting
list are added into a float64 accumulator at the list's passages (one posting per passage in a list, so
a fancy-indexed ``+=`` adds each once), in the query's term order: the same float64 sums, in the same
order, as the dense ``np.bincount`` of `dpr.bm25.search.score_matrix`, hence bit-identical float32
scores. Only the touched passages are read back (and their accumulator cells reset), and the top k is
taken among them; passages the query does not touch score 0 and fill the list, in row order, only when
fewer than k are touched. The order is the dense one everywhere: best first, equal scores by row.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def top_order(scores: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` best of ``scores``, best first, equal scores by ``rows`` (also at the k-th place:
    of the passages tied there, the lowest rows are taken)."""
    if len(scores) > k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        above = np.flatnonzero(scores > kth)
        tied = np.flatnonzero(scores == kth)
        tied = tied[np.argsort(rows[tied], kind="stable")][: k - len(above)]
        pick = np.concatenate([above, tied])
    else:
        pick = np.arange(len(scores))
    return pick[np.lexsort((rows[pick], -scores[pick]))]


def touched_scores(postings: dict[str, Any], terms: Sequence[int], acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows (local to ``postings``) that share a term with the query and their float32 scores (rows scoring 0
    left out). ``acc``: a float64 zero buffer of at least the shard's passages, handed back zeroed."""
    data, indices, indptr = postings["data"], postings["indices"], postings["indptr"]
    spans = [(lo, hi) for lo, hi in ((int(indptr[t]), int(indptr[t + 1])) for t in terms) if hi > lo]
    if not spans:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    parts = []
    for lo, hi in spans:
        # indices as intp once: numpy would convert the int32 rows at every fancy-indexed read and write
        rows = indices[lo:hi].astype(np.intp)
        seen = acc[rows]
        # weights are > 0 (idf > 0, tf > 0): a zero cell is a passage no earlier term touched
        parts.append(rows[seen == 0.0])
        acc[rows] = seen + data[lo:hi]
    rows = np.concatenate(parts)
    scores = acc[rows].astype(np.float32)
    acc[rows] = 0.0
    keep = scores > 0
    return rows[keep], scores[keep]


def shard_top(postings: dict[str, Any], start: int, terms: Sequence[int], k: int,
              acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The query's best ``k`` scoring (> 0) passages of one shard: global rows and scores, best first."""
    rows, scores = touched_scores(postings, terms, acc)
    order = top_order(scores, rows, k)
    return rows[order] + start, scores[order]


def merge_top(parts: list[tuple[np.ndarray, np.ndarray]], k: int, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` of the shards' tops (global rows), then rows scoring 0 in row order up to ``k``."""
    if len(parts) == 1:
        rows, scores = parts[0]
    else:
        rows = np.concatenate([p[0] for p in parts])
        scores = np.concatenate([p[1] for p in parts])
        order = top_order(scores, rows, k)
        rows, scores = rows[order], scores[order]
    rows, scores = rows[:k], scores[:k]
    need = k - len(rows)
    if need > 0:
        # the untouched passages (score 0): the lowest rows not already listed
        fill = np.arange(min(n_docs, need + len(rows)), dtype=np.int64)
        fill = fill[~np.isin(fill, rows)][:need]
        rows = np.concatenate([rows, fill])
        scores = np.concatenate([scores, np.zeros(len(fill), dtype=np.float32)])
    return rows, scores
