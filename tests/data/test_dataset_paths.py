"""DatasetPaths.has_qrels: the one place that says whether a prepared dataset is qrels or QA data."""

from __future__ import annotations

import json

import pytest

from dpr.data.dataset import DatasetPaths
from dpr.errors import DataError


def _dataset(tmp_path, meta: dict | None = None, queries: bool = False) -> DatasetPaths:
    ds = DatasetPaths(tmp_path / "set")
    ds.root.mkdir()
    if meta is not None:
        ds.meta.write_text(json.dumps(meta))
    if queries:
        ds.queries.write_text('{"_id": "q1", "text": "a query"}\n')
    return ds


@pytest.mark.parametrize(("meta", "queries", "expected"), [
    ({"kind": "qrels"}, False, True),
    ({"kind": "qa"}, True, False),  # the meta file's word wins over the files present
    (None, True, True),  # no meta: queries.jsonl means qrels data
    (None, False, False),
    ({"recipe": "beir"}, True, True),  # meta without kind: inferred as without meta
])
def test_has_qrels_follows_kind(tmp_path, meta, queries, expected):
    ds = _dataset(tmp_path, meta, queries)
    assert ds.has_qrels is expected
    assert ds.has_qrels == (ds.kind == "qrels")


def test_has_qrels_refuses_an_unknown_kind(tmp_path):
    ds = _dataset(tmp_path, {"kind": "ranking"})
    with pytest.raises(DataError, match="ranking"):
        ds.has_qrels
