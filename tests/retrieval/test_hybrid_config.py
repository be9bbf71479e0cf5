"""`hybrid_retrieve` takes the hybrid's settings whole (`HybridConfig`, what ``dpr-retrieve mode=hybrid`` builds from
its root): the same fused file and tuning as the same settings given as keywords, keywords overriding the object."""

from __future__ import annotations

import json

import pytest

from dpr.retrieval.fusion import HybridConfig
from dpr.retrieval.runs import hybrid_retrieve


def _results(rows: list[list[tuple[str, float]]], hit: str = "p1") -> list[dict]:
    return [{"question": f"q{i}", "answers": ["a"],
             "ctxs": [{"id": p, "title": "", "text": "", "score": s, "has_answer": p == hit} for p, s in row]}
            for i, row in enumerate(rows)]


@pytest.fixture
def runs(tmp_path):
    bm25, dense = tmp_path / "bm25.json", tmp_path / "dense.json"
    bm25.write_text(json.dumps(_results([[("p1", 12.0), ("p2", 9.0), ("p3", 3.0)], [("p2", 20.0), ("p1", 1.0)]])))
    dense.write_text(json.dumps(_results([[("p3", 0.9), ("p1", 0.8), ("p4", 0.1)], [("p1", 0.7), ("p4", 0.2)]])))
    return bm25, dense


def test_config_object_equals_keywords(runs, tmp_path):
    bm25, dense = runs
    how = HybridConfig(grid=[0.0, 0.5, 2.0], metric="topk", metric_k=1, normalize="none")
    by_object = hybrid_retrieve(bm25, dense, tmp_path / "a.json", bm25_dev=bm25, dense_dev=dense, k=2, hybrid=how)
    by_keywords = hybrid_retrieve(bm25, dense, tmp_path / "b.json", bm25_dev=bm25, dense_dev=dense, k=2,
                                  grid=[0.0, 0.5, 2.0], metric="topk", metric_k=1, normalize="none")
    assert {**by_object, "output": ""} == {**by_keywords, "output": ""}
    assert [row["weight"] for row in by_object["table"]] == [0.0, 0.5, 2.0]
    assert {row["metric"] for row in by_object["table"]} == {"top1"}
    assert by_object["normalize"] == "none" and by_object["metric"] == "topk" and by_object["metric_k"] == 1
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()


def test_keywords_override_the_config_object(runs, tmp_path):
    bm25, dense = runs
    info = hybrid_retrieve(bm25, dense, tmp_path / "rrf.json", fusion="rrf", hybrid=HybridConfig(k_rrf=10.0), k_rrf=5.0)
    assert info == {"fusion": "rrf", "k_rrf": 5.0, "output": str(tmp_path / "rrf.json")}
    with pytest.raises(ValueError, match="k_rrf"):
        hybrid_retrieve(bm25, dense, tmp_path / "x.json", fusion="rrf", hybrid=HybridConfig(k_rrf=-1.0))
    assert not (tmp_path / "x.json").exists()
