"""Compiled BM25 top-k kernels (numba, ``nogil``) for a batch of queries: each shard's candidates
(`shard_candidates`), those of all shards that can be in the top k (`pool_keep`), their exact scores
(`exact_scores`) and the top k (`finish`).

Why compiled: adding a query's postings into an accumulator is a scatter-add, which numpy can only do as
one call per (query, term) with the GIL held between them, at ~10 ns a posting; a compiled loop adds a
posting in ~1 ns and releases the GIL for a whole batch of queries, so threads scale with cores.

Per query and shard: the query terms' postings are added into a float32 accumulator of one cell per
passage of the shard (only the postings are read; the accumulator is zeroed with one sequential pass).
The candidates are then found without sorting the shard: a threshold from a strided sample of the
accumulator (set to let about 8k passages through; lowered if fewer than k pass), one sequential pass
keeping the passages above it, and a partition of those. The float32 sums only pick candidates: a
relative slack (`SLACK`) keeps every passage whose exact score could tie with the k-th, in the shard and
then across shards, and only those left are scored again by summing their weights in the query's own term
order in float64, rounded to float32: the same arithmetic, in the same order, as the dense ``np.bincount``
of `dpr.bm25.search.score_matrix`, hence bit-identical scores and the same order (best first, equal scores
by row).
"""

from __future__ import annotations

import numpy as np
from numba import njit

# relative slack when picking candidates: a float32 sum of a query's weights is within ~1e-6 of the exact
# one, so 1e-5 keeps every passage whose exact float32 score could tie with the k-th
SLACK = 1e-5
# the accumulator sample that sets the threshold: every STRIDE-th cell
STRIDE = 64
# the least positive float32: "> 0" as one ">=" comparison
_TINY = np.float32(1e-45)


def _jit(fn):
    """Compiled without the GIL, the machine code cached beside this file (or in the user's cache directory)
    so a process loads it in milliseconds instead of compiling for seconds."""
    try:
        return njit(nogil=True, cache=True)(fn)
    except RuntimeError:  # no writable cache location (read-only install and home): compile in each process
        return njit(nogil=True)(fn)


@_jit
def rows_ascend(indices: np.ndarray, indptr: np.ndarray) -> bool:
    """Whether every posting list's rows ascend (the binary search in `_weight` needs it)."""
    for t in range(indptr.shape[0] - 1):
        for p in range(indptr[t] + 1, indptr[t + 1]):
            if indices[p] <= indices[p - 1]:
                return False
    return True


@_jit
def sort_lists(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Copies of ``data`` and ``indices`` with each list's rows ascending (for indexes written by other tools)."""
    out_data = np.empty_like(data)
    out_indices = np.empty_like(indices)
    for t in range(indptr.shape[0] - 1):
        lo, hi = indptr[t], indptr[t + 1]
        order = np.argsort(indices[lo:hi], kind="mergesort")
        for i in range(hi - lo):
            out_data[lo + i] = data[lo + order[i]]
            out_indices[lo + i] = indices[lo + order[i]]
    return out_data, out_indices


@_jit
def _weight(data, indices, lo, hi, row):
    """The weight of ``row`` in the list ``[lo, hi)`` (rows ascending), 0 when absent."""
    while lo < hi:
        mid = (lo + hi) >> 1
        r = indices[mid]
        if r < row:
            lo = mid + 1
        elif r > row:
            hi = mid
        else:
            return np.float64(data[mid])
    return 0.0


@_jit
def _above(acc, floor, out):
    """Rows whose ``acc`` is > 0 and >= ``floor`` into ``out``; returns how many."""
    # one float32 comparison a cell: a second (> 0) would be an unpredictable branch, ~20x slower
    floor = max(np.float32(floor), _TINY)
    n = 0
    for r in range(acc.shape[0]):
        if acc[r] >= floor:
            out[n] = r
            n += 1
    return n


@_jit
def _candidates(acc, k, out):
    """The rows that can be in the top k by exact score (the k best of ``acc`` and every row within
    `SLACK` of the k-th), ascending, into ``out``; returns how many."""
    sample = acc[::STRIDE].copy()
    # thresholds that a sample predicts about 8k, 32k, ... rows reach; then every row scoring > 0
    n, above = 0, 8 * k // STRIDE + 8
    while n < k:
        at = sample.shape[0] - above
        floor = np.partition(sample, at)[at] if at > 0 else np.float32(0.0)
        n = _above(acc, floor, out)
        above *= 4
        if floor == 0.0:
            break
    if n <= k:
        return n
    vals = np.empty(n, np.float32)
    for i in range(n):
        vals[i] = acc[out[i]]
    floor = np.partition(vals, n - k)[n - k] * (1.0 - SLACK)
    kept = 0
    for i in range(n):
        if vals[i] >= floor:
            out[kept] = out[i]
            kept += 1
    return kept


@_jit
def _exact_score(data, indices, indptr, terms, row):
    """A row's score as the dense scoring computes it: its weights summed in query order in float64,
    rounded to float32."""
    s = 0.0
    for j in range(terms.shape[0]):
        t = terms[j]
        s += _weight(data, indices, indptr[t], indptr[t + 1], row)
    return np.float32(s)


@_jit
def _grow(a, need):
    if need <= a.shape[0]:
        return a
    out = np.empty(max(need, 2 * a.shape[0]), a.dtype)
    out[:a.shape[0]] = a
    return out


@_jit
def shard_candidates(data, indices, indptr, n_docs, q_terms, q_ptr, k, start):
    """Per query, the passages of one shard (of ``n_docs``, the first at ``start``) that can be in its top k:
    ``counts[q]`` of them, as global rows with their float32 partial scores, query after query. Query
    ``q``'s terms are ``q_terms[q_ptr[q]:q_ptr[q + 1]]``."""
    n_q = q_ptr.shape[0] - 1
    acc = np.zeros(n_docs, np.float32)
    cand = np.empty(n_docs, np.int32)
    counts = np.zeros(n_q, np.int64)
    rows = np.empty(2 * k * n_q + 16, np.int64)
    vals = np.empty(2 * k * n_q + 16, np.float32)
    at = 0
    for q in range(n_q):
        for j in range(q_ptr[q], q_ptr[q + 1]):
            t = q_terms[j]
            for p in range(indptr[t], indptr[t + 1]):
                acc[indices[p]] += data[p]
        n = _candidates(acc, k, cand)
        rows = _grow(rows, at + n)
        vals = _grow(vals, at + n)
        for i in range(n):
            rows[at + i] = start + cand[i]
            vals[at + i] = acc[cand[i]]
        counts[q] = n
        at += n
        acc[:] = 0.0
    return counts, rows[:at], vals[:at]


@_jit
def _starts(counts):
    """Where shard s's candidates of query q start in the flat arrays (shard after shard, query after query
    within a shard), and how many there are in all."""
    n_shards, n_q = counts.shape
    first = np.zeros((n_shards, n_q), np.int64)
    at = 0
    for s in range(n_shards):
        for q in range(n_q):
            first[s, q] = at
            at += counts[s, q]
    return first, at


@_jit
def pool_keep(counts, vals, k):
    """Which of the shards' candidates (``counts[s, q]`` each, shard after shard, query after query within
    a shard) can be in their query's top k: the pool's k-th best partial score within `SLACK`."""
    n_shards, n_q = counts.shape
    first, total = _starts(counts)
    keep = np.ones(total, np.bool_)
    for q in range(n_q):
        total = 0
        for s in range(n_shards):
            total += counts[s, q]
        if total <= k:
            continue
        pool = np.empty(total, np.float32)
        i = 0
        for s in range(n_shards):
            pool[i:i + counts[s, q]] = vals[first[s, q]:first[s, q] + counts[s, q]]
            i += counts[s, q]
        floor = np.partition(pool, total - k)[total - k] * (1.0 - SLACK)
        for s in range(n_shards):
            for j in range(first[s, q], first[s, q] + counts[s, q]):
                keep[j] = vals[j] >= floor
    return keep


@_jit
def exact_scores(data, indices, indptr, q_terms, q_ptr, counts, rows, keep, start, out):
    """The exact scores (`_exact_score`) of one shard's kept candidates (``rows``: global, ``counts[q]`` per
    query, query after query) into ``out``."""
    at = 0
    for q in range(q_ptr.shape[0] - 1):
        terms = q_terms[q_ptr[q]:q_ptr[q + 1]]
        for j in range(at, at + counts[q]):
            if keep[j]:
                out[j] = _exact_score(data, indices, indptr, terms, rows[j] - start)
        at += counts[q]


@_jit
def finish(counts, rows, scores, keep, out_rows, out_scores):
    """Each query's top k (``k`` = ``out_rows.shape[1]``, at most the number of passages) of the kept
    candidates by exact score, best first, equal scores by row; then the rows scoring 0, lowest first."""
    n_shards, n_q = counts.shape
    k = out_rows.shape[1]
    first, _ = _starts(counts)
    for q in range(n_q):
        n = 0
        for s in range(n_shards):
            for j in range(first[s, q], first[s, q] + counts[s, q]):
                n += keep[j]
        r = np.empty(n, np.int64)
        v = np.empty(n, np.float32)
        i = 0
        for s in range(n_shards):
            for j in range(first[s, q], first[s, q] + counts[s, q]):
                if keep[j]:
                    r[i] = rows[j]
                    v[i] = scores[j]
                    i += 1
        by_row = np.argsort(r, kind="mergesort")
        r, v = r[by_row], v[by_row]
        order = np.argsort(-v, kind="mergesort")  # stable: equal scores keep ascending rows
        n = min(k, n)
        for i in range(n):
            out_rows[q, i] = r[order[i]]
            out_scores[q, i] = v[order[i]]
        _fill_untouched(out_rows[q], out_scores[q], n)


@_jit
def _fill_untouched(rows, scores, n):
    """After the ``n`` scored rows, the rows scoring 0: lowest first, skipping the listed ones."""
    taken = np.sort(rows[:n])
    row, j = 0, 0
    for i in range(n, rows.shape[0]):
        while j < n and taken[j] <= row:
            if taken[j] == row:
                row += 1
            j += 1
        rows[i] = row
        scores[i] = 0.0
        row += 1
