"""An index the built-in builder writes records that its posting lists' rows ascend, so search trusts it and does not
read every posting to check; an index without the record (another tool's) is still checked and sorted."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from dpr import bm25
from dpr.bm25 import kernels
from dpr.bm25.index import META_FILE
from tests.bm25.test_postings_search import _rows, _same

TEXTS = [f"passage {i} about topic {i % 7} with word{i % 11} and term{i % 3}" for i in range(60)]
QUERIES = ["topic 3 word5", "term1 passage", "word10 topic 6 term2", "nothing here"]


@pytest.fixture(params=[None, 25], ids=["one-shot", "sharded"])
def saved(request, tmp_path):
    kw = {} if request.param is None else {"shard_passages": request.param}
    index = bm25.build_index_from_rows(_rows(TEXTS), stopwords=None, **kw)
    assert index.rows_ascend and (index.shards is None) == (request.param is None)
    for shard in index.postings():  # the record is true
        assert kernels.rows_ascend(np.asarray(shard.scores["indices"], dtype=np.int32),
                                   np.asarray(shard.scores["indptr"], dtype=np.int64))
    return bm25.save_index(index, tmp_path / "index")


def _search(index):
    return bm25.search_indices(index, QUERIES, k=10, n_threads=0, show_progress=False)


def test_a_recorded_index_is_searched_without_the_check(saved, monkeypatch):
    assert json.loads((saved / META_FILE).read_text())["rows_ascend"] is True
    checked = bm25.load_index(saved)
    want = _search(dataclasses.replace(checked, rows_ascend=False, search_lists=None))

    def refuse(*_):
        raise AssertionError("a recorded index was checked")

    monkeypatch.setattr(kernels, "rows_ascend", refuse)
    index = bm25.load_index(saved)
    assert index.rows_ascend and "rows_ascend" not in index.meta
    _same(_search(index), want)


def test_an_index_without_the_record_is_checked(saved, monkeypatch):
    meta = json.loads((saved / META_FILE).read_text())
    del meta["rows_ascend"]
    (saved / META_FILE).write_text(json.dumps(meta))
    calls = []
    real = kernels.rows_ascend

    def counted(*a):
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(kernels, "rows_ascend", counted)
    index = bm25.load_index(saved)
    assert not index.rows_ascend
    _search(index)
    assert len(calls) == len(index.postings())


@pytest.mark.parametrize("shard_passages", [None, 25], ids=["one-shot", "sharded"])
def test_a_record_that_sampled_lists_belie_is_not_trusted(shard_passages):
    kw = {} if shard_passages is None else {"shard_passages": shard_passages}
    want = _search(bm25.build_index_from_rows(_rows(TEXTS), stopwords=None, **kw))
    index = bm25.build_index_from_rows(_rows(TEXTS), stopwords=None, **kw)
    for shard in index.postings():  # every list's rows descending, as a hand edit of the files could leave them
        p = shard.scores
        data, indices, indptr = np.array(p["data"]), np.array(p["indices"]), np.asarray(p["indptr"])
        for lo, hi in zip(indptr[:-1], indptr[1:]):
            data[lo:hi], indices[lo:hi] = data[lo:hi][::-1].copy(), indices[lo:hi][::-1].copy()
        p["data"], p["indices"] = data, indices
    assert index.rows_ascend
    _same(_search(index), want)
