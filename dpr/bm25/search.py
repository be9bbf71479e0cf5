"""BM25 search: the top k passages of many queries at once over a `BM25Index`.

The top k (`search_indices`) adds only the query terms' posting lists into a per-passage accumulator and
picks the top from it without sorting (`dpr.bm25.kernels`, exact: the scores and order of the dense
scoring), shard by shard for a sharded index, merging the shards' tops. The kernels are compiled and
release the GIL, so batches of queries run on threads, all cores unless told otherwise. `score_matrix`
gives the dense scores of every passage, for callers that need them all (the BM25 teacher).
"""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple, Sequence

import numpy as np
from tqdm import tqdm

from dpr.bm25.index import BM25Index
from dpr.checks import MAX_K, check_int

log = logging.getLogger(__name__)

# Queries per batch (a thread's unit of work); a batch's memory is its results plus one shard's accumulator.
QUERY_BATCH = 256


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _resolve_threads(n_threads: int) -> int:
    return available_cores() if n_threads < 0 else n_threads


def _dense_block(postings: dict[str, Any], token_ids: Sequence[Sequence[int]]) -> np.ndarray:
    data, indices, indptr = postings["data"], postings["indices"], postings["indptr"]
    n_docs = int(postings["num_docs"])
    batch = len(token_ids)
    q_of = np.repeat(np.arange(batch, dtype=np.int64), [len(t) for t in token_ids])
    terms = np.fromiter((t for toks in token_ids for t in toks), dtype=np.int64, count=len(q_of))
    starts, ends = indptr[terms], indptr[terms + 1]
    lengths = ends - starts
    total = int(lengths.sum())
    # positions of every posting of every (query, term): start of its list + offset within it
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    postings_at = np.repeat(starts, lengths) + offsets
    flat = np.repeat(q_of, lengths) * n_docs + indices[postings_at]
    scores = np.bincount(flat, weights=data[postings_at], minlength=batch * n_docs)
    return scores.reshape(batch, n_docs).astype(np.float32)


def score_matrix(index: BM25Index, token_ids: Sequence[Sequence[int]]) -> np.ndarray:
    """BM25 scores ``[queries, passages]`` (float32) of tokenized queries against every passage.

    bm25s keeps the BM25 weight of every (term, passage) pair in a CSC matrix (a posting list per
    term). Rather than bm25s' per-query loop with ``np.add.at``, the posting lists of all
    (query, term) pairs of the batch are gathered at once and summed with one ``np.bincount``. The
    scores are bm25s' own (same weights; the sum is taken in float64 and rounded to float32, so it can
    differ from bm25s' float32 sum in the last bit; a query term given twice counts twice, as in bm25s).
    A sharded index's shards give their columns in turn.
    """
    blocks = [_dense_block(shard.scores, token_ids) for shard in index.postings()]
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=1)


def score_texts(index: BM25Index, queries: Sequence[str]) -> np.ndarray:
    """BM25 scores ``[queries, passages]`` of query strings against every passage (index row order)."""
    return score_matrix(index, _query_token_ids(index, queries))


class _Lists(NamedTuple):
    """One shard's postings as the kernels take them (read-only views: one compiled signature whether the
    postings are memory-mapped or built in memory)."""

    start: int
    num_docs: int
    data: np.ndarray  # float32 weights
    indices: np.ndarray  # int32 rows (local to the shard), ascending within each list
    indptr: np.ndarray  # int64 list bounds


def _readonly(a: np.ndarray, dtype) -> np.ndarray:
    view = np.ascontiguousarray(a, dtype=dtype).view()
    view.flags.writeable = False
    return view


# Posting lists of a recorded index (its meta file says its rows ascend) checked before it is trusted: a few evenly
# spaced lists a shard (about 100 KiB of file pages each, with the kernel's read-ahead) catch an index whose files
# were replaced or edited by hand since it was recorded.
SAMPLE_LISTS = 16


def _sample_ascends(indices: np.ndarray, indptr: np.ndarray) -> bool:
    """Whether the rows of up to `SAMPLE_LISTS` evenly spaced posting lists ascend (reads only those lists)."""
    if indptr.shape[0] < 2:  # no terms
        return True
    terms = np.unique(np.linspace(0, indptr.shape[0] - 2, num=SAMPLE_LISTS).astype(np.int64))
    return all(bool(np.all(np.diff(indices[indptr[t]:indptr[t + 1]]) > 0)) for t in terms)


def _lists(index: BM25Index) -> list[_Lists]:
    """The index's postings in the kernels' form (made once per index)."""
    from dpr.bm25 import kernels  # numba: imported by the processes that search, not by all that import dpr.bm25

    if index.search_lists is None:
        made = []
        for shard in index.postings():
            p = shard.scores
            data, indices = _readonly(p["data"], np.float32), _readonly(p["indices"], np.int32)
            indptr = _readonly(p["indptr"], np.int64)
            # an index without the record (written by other tools), or whose sampled lists belie it, is checked in
            # full (every posting read once), and its lists sorted once if need be
            trusted = index.rows_ascend and _sample_ascends(indices, indptr)
            if index.rows_ascend and not trusted:
                log.warning("BM25 index records that its rows ascend, but a sampled posting list's do not: checking "
                            "every list of shard at row %d", shard.start)
            if not trusted and not kernels.rows_ascend(indices, indptr):
                data, indices = (_readonly(a, a.dtype) for a in kernels.sort_lists(data, indices, indptr))
            made.append(_Lists(shard.start, shard.num_docs, data, indices, indptr))
        index.search_lists = made
    return index.search_lists


def _top_batch(index: BM25Index, token_ids: Sequence[Sequence[int]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k rows and scores of a batch of tokenized queries: each shard's candidates (partial float32 scores),
    those of the pool that can be in the top k, their exact scores, the top. The kernels release the GIL."""
    from dpr.bm25 import kernels

    lists = _lists(index)
    q_ptr = np.zeros(len(token_ids) + 1, dtype=np.int64)
    np.cumsum([len(t) for t in token_ids], out=q_ptr[1:])
    q_terms = np.fromiter((t for toks in token_ids for t in toks), dtype=np.int64, count=int(q_ptr[-1]))
    found = [kernels.shard_candidates(li.data, li.indices, li.indptr, li.num_docs, q_terms, q_ptr, k, li.start)
             for li in lists]
    counts = np.stack([f[0] for f in found])
    cand_rows = [f[1] for f in found]
    keep = kernels.pool_keep(counts, np.concatenate([f[2] for f in found]), k)
    exact = np.zeros(len(keep), dtype=np.float32)
    at = 0
    for li, shard_counts, shard_rows in zip(lists, counts, cand_rows):
        stop = at + len(shard_rows)
        kernels.exact_scores(li.data, li.indices, li.indptr, q_terms, q_ptr, shard_counts, shard_rows,
                             keep[at:stop], li.start, exact[at:stop])
        at = stop
    rows = np.empty((len(token_ids), k), dtype=np.int64)
    scores = np.empty((len(token_ids), k), dtype=np.float32)
    kernels.finish(counts, np.concatenate(cand_rows), exact, keep, rows, scores)
    return rows, scores


def _query_token_ids(index: BM25Index, queries: Sequence[str]) -> list[list[int]]:
    # update_vocab=False: query words unseen in the corpus cannot score anything (they are dropped;
    # a query left empty becomes the empty token, which no passage has: all scores 0).
    return index.tokenizer.tokenize(list(queries), update_vocab=False, show_progress=False, return_as="ids")


def search_indices(
    index: BM25Index, queries: Sequence[str], k: int = 100, n_threads: int = -1, show_progress: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k passage rows and scores, ``[num_queries, k']`` each with ``k' = min(k, passages)``.

    Within a query, passages are ordered by score, ties by index row. Batches of queries are scored on
    ``n_threads`` threads: -1 (default) = every core this process may use, 0 = the calling thread.
    """
    k = min(check_int("k", k, 1, MAX_K), len(index))
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    n = len(queries)
    rows = np.empty((n, k), dtype=np.int64)
    scores = np.empty((n, k), dtype=np.float32)
    threads = _resolve_threads(n_threads)
    # a batch per thread at least (a caller's chunk of queries may be small), QUERY_BATCH at most
    batch = max(1, min(QUERY_BATCH, -(-n // max(1, threads))))
    spans = [(s, min(n, s + batch)) for s in range(0, n, batch)]
    bar = tqdm(total=n, desc="BM25 search", unit="q", disable=not show_progress, mininterval=1.0)

    def run(span: tuple[int, int]) -> tuple[int, int]:
        start, stop = span
        rows[start:stop], scores[start:stop] = _top_batch(index, token_ids[start:stop], k)
        return span

    token_ids = _query_token_ids(index, queries)
    _lists(index)  # once, before the threads: each would otherwise check the whole index on a first search
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
    index: BM25Index, queries: Sequence[str], k: int = 100, n_threads: int = -1, show_progress: bool = True
) -> tuple[list[list[str]], np.ndarray]:
    """Top-k passage ids (best first) and their scores for each query."""
    rows, scores = search_indices(index, queries, k, n_threads=n_threads, show_progress=show_progress)
    ids = index.ids
    return [[ids[r] for r in row] for row in rows.tolist()], scores
