"""BM25 search: the top k passages of many queries at once over a `BM25Index`."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
from tqdm import tqdm

from dpr.bm25.index import BM25Index
from dpr.checks import MAX_K, check_int

# Most queries scored together (fewer for big corpora: the dense score block is batch x passages).
QUERY_BATCH = 256


def _resolve_threads(n_threads: int) -> int:
    return (os.cpu_count() or 1) if n_threads < 0 else n_threads


def score_matrix(index: BM25Index, token_ids: Sequence[Sequence[int]]) -> np.ndarray:
    """BM25 scores ``[queries, passages]`` (float32) of tokenized queries against every passage.

    bm25s keeps the BM25 weight of every (term, passage) pair in a CSC matrix (a posting list per
    term). Rather than bm25s' per-query loop with ``np.add.at``, the posting lists of all
    (query, term) pairs of the batch are gathered at once and summed with one ``np.bincount``. The
    scores are bm25s' own (same weights; the sum is taken in float64 and rounded to float32, so it can
    differ from bm25s' float32 sum in the last bit; a query term given twice counts twice, as in bm25s).
    """
    sc = index.retriever.scores
    data, indices, indptr = sc["data"], sc["indices"], sc["indptr"]
    n_docs = int(sc["num_docs"])
    batch = len(token_ids)
    q_of = np.repeat(np.arange(batch, dtype=np.int64), [len(t) for t in token_ids])
    terms = np.fromiter((t for toks in token_ids for t in toks), dtype=np.int64, count=len(q_of))
    starts, ends = indptr[terms], indptr[terms + 1]
    lengths = ends - starts
    total = int(lengths.sum())
    # positions of every posting of every (query, term): start of its list + offset within it
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    postings = np.repeat(starts, lengths) + offsets
    flat = np.repeat(q_of, lengths) * n_docs + indices[postings]
    scores = np.bincount(flat, weights=data[postings], minlength=batch * n_docs)
    return scores.reshape(batch, n_docs).astype(np.float32)


def score_texts(index: BM25Index, queries: Sequence[str]) -> np.ndarray:
    """BM25 scores ``[queries, passages]`` of query strings against every passage (index row order)."""
    return score_matrix(index, _query_token_ids(index, queries))


def _score_batch(index: BM25Index, token_ids: Sequence[Sequence[int]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores of a batch of tokenized queries against every passage (:func:`score_matrix`) and their
    top k: one ``argpartition`` over the ``[batch, passages]`` matrix."""
    scores = score_matrix(index, token_ids)
    batch, n_docs = scores.shape
    if k < n_docs:
        # partition the negated scores at k-1: with most passages at 0 (no shared term), selecting
        # from the bottom is ~10x faster in numpy's introselect than selecting the top n-k
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    else:
        top = np.broadcast_to(np.arange(n_docs), (batch, n_docs))
    top_scores = np.take_along_axis(scores, top, axis=1)
    # best first; equal scores by passage row, so the order never depends on the partial sort
    order = np.lexsort((top, -top_scores), axis=1)
    return np.take_along_axis(top, order, axis=1), np.take_along_axis(top_scores, order, axis=1)


def _query_token_ids(index: BM25Index, queries: Sequence[str]) -> list[list[int]]:
    # update_vocab=False: query words unseen in the corpus cannot score anything (they are dropped;
    # a query left empty becomes the empty token, which no passage has: all scores 0).
    return index.tokenizer.tokenize(list(queries), update_vocab=False, show_progress=False, return_as="ids")


def search_indices(
    index: BM25Index, queries: Sequence[str], k: int = 100, n_threads: int = 0, show_progress: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k passage rows and scores, ``[num_queries, k']`` each with ``k' = min(k, passages)``.

    Within a query, passages are ordered by score, ties by index row. ``n_threads`` > 0 scores
    batches in that many threads (numpy releases the GIL in the heavy parts); -1 = all cores.
    """
    k = min(check_int("k", k, 1, MAX_K), len(index))
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    n = len(queries)
    rows = np.empty((n, k), dtype=np.int64)
    scores = np.empty((n, k), dtype=np.float32)
    # the dense [batch, passages] score block is kept near 4 MB (cache-friendly; measured faster
    # than bigger blocks) whatever the corpus size
    batch = int(max(1, min(QUERY_BATCH, (1 << 19) // max(1, len(index)))))
    spans = [(s, min(n, s + batch)) for s in range(0, n, batch)]
    threads = _resolve_threads(n_threads)
    bar = tqdm(total=n, desc="BM25 search", unit="q", disable=not show_progress, mininterval=1.0)

    def run(span: tuple[int, int]) -> tuple[int, int]:
        start, stop = span
        r, s = _score_batch(index, token_ids[start:stop], k)
        rows[start:stop], scores[start:stop] = r, s
        return span

    token_ids = _query_token_ids(index, queries)
    if threads > 1 and len(spans) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=threads) as pool:
            for start, stop in pool.map(run, spans):
                bar.update(stop - start)
    else:
        for span in spans:
            run(span)
            bar.update(span[1] - span[0])
    bar.close()
    return rows, scores


def search(
    index: BM25Index, queries: Sequence[str], k: int = 100, n_threads: int = 0, show_progress: bool = True
) -> tuple[list[list[str]], np.ndarray]:
    """Top-k passage ids (best first) and their scores for each query."""
    rows, scores = search_indices(index, queries, k, n_threads=n_threads, show_progress=show_progress)
    ids = index.ids
    return [[ids[r] for r in row] for row in rows.tolist()], scores
