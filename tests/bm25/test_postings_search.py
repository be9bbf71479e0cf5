"""BM25 top k from posting lists and from shards equals the dense scoring of every passage, exactly.

The reference is `score_matrix` (every passage's float32 score) ordered in full: best first, equal
scores by row. Random small corpora over a small vocabulary make many ties (at the k-th place too),
queries with no known word, queries touching fewer than k passages, and k at or above the corpus size.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpr import bm25
from dpr.bm25.search import _query_token_ids, score_matrix

WORDS = ["river", "mountain", "castle", "forest", "ocean", "desert", "island", "valley"]
passage = st.lists(st.sampled_from(WORDS), min_size=0, max_size=7).map(" ".join)
query = st.lists(st.sampled_from(WORDS + ["zebra", "the"]), min_size=0, max_size=4).map(" ".join)


def _rows(texts):
    return [{"id": f"p{i}", "title": "", "text": t or "nothing"} for i, t in enumerate(texts)]


def dense_top(index, queries, k):
    """Every passage scored (bincount over all rows), ordered in full: best first, equal scores by row."""
    scores = score_matrix(index, _query_token_ids(index, queries))
    n = scores.shape[1]
    k = min(k, n)
    order = np.stack([np.lexsort((np.arange(n), -row))[:k] for row in scores])
    return order, np.take_along_axis(scores, order, axis=1)


def _same(got, want):
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1].dtype == np.float32
    np.testing.assert_array_equal(got[1], want[1])


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(passage, min_size=1, max_size=25), queries=st.lists(query, min_size=1, max_size=6),
       k=st.integers(1, 30))
def test_posting_list_top_k_equals_dense_scoring(texts, queries, k):
    index = bm25.build_index_from_rows(_rows(texts))
    _same(bm25.search_indices(index, queries, k=k, n_threads=0, show_progress=False), dense_top(index, queries, k))


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(passage, min_size=2, max_size=25), queries=st.lists(query, min_size=1, max_size=6),
       k=st.integers(1, 30), data=st.data())
def test_sharded_build_equals_one_shot(texts, queries, k, data):
    shard = data.draw(st.integers(1, len(texts) - 1), label="shard_passages")
    one = bm25.build_index_from_rows(_rows(texts))
    sharded = bm25.build_index_from_rows(_rows(texts), shard_passages=shard)
    assert sharded.shards is not None and len(sharded.shards) == -(-len(texts) // shard)
    # the same weights: each term's postings are the one-shot list cut at the shard bounds
    whole = one.retriever.scores
    for t in range(len(whole["indptr"]) - 1):
        lo, hi = whole["indptr"][t], whole["indptr"][t + 1]
        rows = np.concatenate([sh.scores["indices"][sh.scores["indptr"][t]:sh.scores["indptr"][t + 1]] + sh.start
                               for sh in sharded.shards])
        data_t = np.concatenate([sh.scores["data"][sh.scores["indptr"][t]:sh.scores["indptr"][t + 1]]
                                 for sh in sharded.shards])
        np.testing.assert_array_equal(rows, whole["indices"][lo:hi])
        assert data_t.tobytes() == whole["data"][lo:hi].tobytes()
    tokens = _query_token_ids(one, queries)
    np.testing.assert_array_equal(score_matrix(sharded, tokens), score_matrix(one, tokens))
    want = dense_top(one, queries, k)
    _same(bm25.search_indices(sharded, queries, k=k, n_threads=0, show_progress=False), want)
    _same(bm25.search_indices(one, queries, k=k, n_threads=0, show_progress=False), want)


def test_ties_at_the_kth_place_take_the_lowest_rows():
    # twelve identical passages: every score ties; the top 5 are rows 0-4, whatever the selection algorithm
    index = bm25.build_index_from_rows(_rows(["river castle"] * 12 + ["ocean"]))
    rows, scores = bm25.search_indices(index, ["river"], k=5, show_progress=False)
    assert rows.tolist() == [[0, 1, 2, 3, 4]] and len(set(scores[0].tolist())) == 1
    # two passages touched, k = 6: the untouched ones fill in row order, at score 0
    index = bm25.build_index_from_rows(_rows(["ocean"] * 5 + ["river"] + ["ocean"] * 3 + ["river"]))
    rows, scores = bm25.search_indices(index, ["river"], k=6, show_progress=False)
    assert rows.tolist() == [[5, 9, 0, 1, 2, 3]] and scores[0, 2:].tolist() == [0.0] * 4


def test_threads_give_the_calling_threads_results(tiny_data_dir):
    index = bm25.build_index(tiny_data_dir / "tiny" / "passages.tsv", shard_passages=3)
    queries = ["capital of hawaii", "where does water boil", "largest ocean", "zzz"] * 40
    want = bm25.search_indices(index, queries, k=6, n_threads=0, show_progress=False)
    for n_threads in (2, -1):
        _same(bm25.search_indices(index, queries, k=6, n_threads=n_threads, show_progress=False), want)


def test_sharded_index_saves_loads_and_is_reused(tiny_data_dir, tmp_path):
    import json

    passages = tiny_data_dir / "tiny" / "passages.tsv"
    queries = ["what is the capital of hawaii", "highest mountain", "nothing known here"]
    one = bm25.build_index(passages)
    want = bm25.search(one, queries, k=8, show_progress=False)
    built = bm25.get_or_build_index(passages, tmp_path / "idx", shard_passages=3)
    meta = json.loads((tmp_path / "idx" / "dpr_bm25.json").read_text())
    assert meta["format"] == 2 and [s["passages"] for s in meta["shards"]] == [3, 3, 2]
    assert sorted(p.name for p in (tmp_path / "idx" / "shards").iterdir()) == ["00000", "00001", "00002"]
    loaded = bm25.load_index(tmp_path / "idx")
    assert loaded.shards is not None and loaded.ids == one.ids
    for index in (built, loaded):
        got = bm25.search(index, queries, k=8, show_progress=False)
        assert got[0] == want[0]
        np.testing.assert_array_equal(got[1], want[1])
    # the shard size is not part of the index's key: the default size reuses the sharded index
    again = bm25.get_or_build_index(passages, tmp_path / "idx")
    assert again.shards is not None


def test_one_shard_when_the_corpus_fits(tiny_data_dir, tmp_path):
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    index = bm25.build_index(passages, shard_passages=8)
    assert index.shards is None and index.retriever.scores["num_docs"] == 8
    bm25.save_index(index, tmp_path / "idx")
    assert not (tmp_path / "idx" / "shards").exists()
    with pytest.raises(ValueError, match="shard_passages"):
        bm25.build_index(passages, shard_passages=0)


def test_search_and_mining_use_every_core_by_default(tiny_data_dir, monkeypatch):
    import importlib
    import inspect
    import threading
    import time

    from dpr.negatives import bm25 as mining
    from dpr.retrieval import BM25Retriever

    search_mod = importlib.import_module("dpr.bm25.search")
    index = bm25.build_index(tiny_data_dir / "tiny" / "passages.tsv")
    monkeypatch.setattr(search_mod, "available_cores", lambda: 4)
    seen, real = set(), search_mod._top_batch

    def spy(*args, **kwargs):
        seen.add(threading.get_ident())
        time.sleep(0.05)  # each batch outlasts the submission of the next: the pool starts more threads
        return real(*args, **kwargs)

    monkeypatch.setattr(search_mod, "_top_batch", spy)
    rows, _ = bm25.search_indices(index, ["capital of hawaii"] * 40, k=3, show_progress=False)
    assert len(seen) > 1 and threading.get_ident() not in seen and rows.shape == (40, 3)
    # what the pipeline builds (no n_threads given): every core
    assert BM25Retriever(index).n_threads == -1
    for fn in (mining.mine_hard_negatives, mining.mine_dataset):
        assert inspect.signature(fn).parameters["n_threads"].default == -1

