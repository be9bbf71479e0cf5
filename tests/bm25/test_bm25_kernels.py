"""The compiled BM25 top k (`dpr.bm25.kernels`) on corpora big enough for its sampled threshold, its
candidate selection on its own, and indexes whose posting lists are not in row order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpr import bm25
from dpr.bm25 import kernels
from tests.bm25.test_postings_search import _rows, _same, dense_top


def _zipf_corpus(n: int, seed: int) -> list[str]:
    """``n`` passages over a 400-word vocabulary with Zipf frequencies, a few of them repeated verbatim
    (exact score ties), lengths 3-40."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(400)]
    p = 1.0 / np.arange(1, 401) ** 1.1
    p /= p.sum()
    texts = [" ".join(rng.choice(vocab, size=int(rng.integers(3, 41)), p=p)) for _ in range(n)]
    for i in range(0, n, 97):  # copies of earlier passages: equal scores, ordered by row
        texts[i] = texts[i // 2]
    return texts


@pytest.fixture(scope="module")
def zipf_indexes():
    texts = _zipf_corpus(3000, seed=3)
    rng = np.random.default_rng(4)
    queries = [" ".join(rng.choice([f"w{i}" for i in range(400)], size=int(rng.integers(1, 9)))) for _ in range(40)]
    queries += ["", "zzz unknown", "w0", "w0 w1 w2"]
    one = bm25.build_index_from_rows(_rows(texts), stopwords=None)
    sharded = bm25.build_index_from_rows(_rows(texts), shard_passages=700, stopwords=None)
    return one, sharded, queries


@pytest.mark.parametrize("k", [1, 10, 100, 2999, 3000])
def test_top_k_equals_dense_scoring_on_a_corpus_the_threshold_samples(zipf_indexes, k):
    # 3000 passages: the accumulator sample (every 64th cell) sets the threshold; ties from repeated passages
    one, sharded, queries = zipf_indexes
    want = dense_top(one, queries, k)
    _same(bm25.search_indices(one, queries, k=k, n_threads=0, show_progress=False), want)
    _same(bm25.search_indices(sharded, queries, k=k, n_threads=2, show_progress=False), want)


def _true_top(acc: np.ndarray, k: int) -> set[int]:
    """Rows of the k best positive cells, every row tied with the k-th included."""
    pos = np.flatnonzero(acc > 0)
    if len(pos) <= k:
        return set(pos.tolist())
    kth = np.sort(acc[pos])[len(pos) - k]
    return set(pos[acc[pos] >= kth].tolist())


cells = st.one_of(st.just(0.0), st.just(1.0), st.floats(0.125, 50.0, width=32))


@settings(max_examples=80, deadline=None)
@given(acc=st.lists(cells, min_size=1, max_size=4000).map(lambda v: np.array(v, dtype=np.float32)),
       k=st.integers(1, 300))
def test_candidates_keep_every_row_that_can_be_in_the_top_k(acc, k):
    out = np.empty(len(acc), dtype=np.int32)
    n = kernels._candidates(acc, k, out)
    got = out[:n]
    assert np.all(np.diff(got) > 0), "candidates ascend, each once"
    assert np.all(acc[got] > 0)
    assert _true_top(acc, k) <= set(got.tolist())
    positives = int((acc > 0).sum())
    if positives > k:  # no more than the k best and the rows within SLACK of the k-th
        kth = np.sort(acc[acc > 0])[positives - k]
        assert np.all(acc[got] >= kth * (1 - kernels.SLACK))


def test_candidates_when_the_sample_sees_only_high_cells():
    # every sampled cell (each 64th) is high, the few other positives low: the first threshold lets fewer
    # than k through, so it is lowered until k pass
    acc = np.zeros(64 * 200, dtype=np.float32)
    acc[::64] = 9.0
    acc[5:800:64] = 1.0
    out = np.empty(len(acc), dtype=np.int32)
    n = kernels._candidates(acc, 210, out)
    assert set(out[:n].tolist()) == set(np.flatnonzero(acc > 0).tolist())


def test_posting_lists_out_of_row_order_give_the_same_top_k(zipf_indexes):
    # an index whose lists are not sorted by row (bm25s' own or another tool's): sorted once, same results
    one, _, queries = zipf_indexes
    want = bm25.search_indices(one, queries, k=20, n_threads=0, show_progress=False)
    scores = dict(one.retriever.scores)
    data, indices = scores["data"].copy(), scores["indices"].copy()
    rng = np.random.default_rng(0)
    for t in range(len(scores["indptr"]) - 1):
        lo, hi = int(scores["indptr"][t]), int(scores["indptr"][t + 1])
        perm = lo + rng.permutation(hi - lo)
        data[lo:hi], indices[lo:hi] = data[perm], indices[perm]
    assert not kernels.rows_ascend(indices, scores["indptr"].astype(np.int64))

    class Shuffled:
        pass

    retriever = Shuffled()
    retriever.scores = {**scores, "data": data, "indices": indices}
    shuffled = bm25.BM25Index(retriever=retriever, tokenizer=one.tokenizer, ids=one.ids, params=one.params)
    _same(bm25.search_indices(shuffled, queries, k=20, n_threads=0, show_progress=False), want)


def test_kernels_compile_without_a_writable_cache(monkeypatch):
    # numba refuses cache=True where neither the package's folder nor the user's cache folder is writable
    # (a read-only install and home): the kernels are then compiled in each process instead
    real = kernels.njit

    def no_cache_location(**options):
        if options.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file 'kernels.py'")
        return real(**options)

    monkeypatch.setattr(kernels, "njit", no_cache_location)

    def double(x):
        return 2 * x

    compiled = kernels._jit(double)
    assert compiled(21) == 42 and type(compiled._cache).__name__ == "NullCache"
