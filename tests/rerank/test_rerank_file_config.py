"""`rerank_file` takes the scoring settings whole (`RerankScoreConfig`, ``rerank.score``, what ``dpr-rerank score``
composed): the same file and stats as the same settings given as keywords, keywords overriding the object."""

from __future__ import annotations

import json

import pytest

from dpr.rerank.config import RerankScoreConfig
from dpr.rerank.rerank_file import rerank_file

from tests.rerank.test_rerank_file import _qa_results, ce_dir  # noqa: F401 - the cross-encoder fixture


def _timeless(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if not k.startswith("seconds")}


def test_score_config_equals_keywords(ce_dir, tmp_path):  # noqa: F811
    _qa_results(tmp_path / "dev.json", n=5)
    score = RerankScoreConfig(k=3, batch_size=2, precision="fp32", max_questions=4)
    by_object = rerank_file(ce_dir, tmp_path / "dev.json", tmp_path / "a.json", score, weight=0.5)
    by_keywords = rerank_file(ce_dir, tmp_path / "dev.json", tmp_path / "b.json", k=3, batch_size=2,
                              precision="fp32", max_questions=4, weight=0.5)
    assert _timeless(by_object) == _timeless(by_keywords)
    assert by_object["k"] == 3 and by_object["questions"] == 4 and by_object["pairs"] == 12
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads((tmp_path / "b.json").read_text())


def test_keywords_override_the_score_config(ce_dir, tmp_path):  # noqa: F811
    _qa_results(tmp_path / "dev.json", n=3)
    stats = rerank_file(ce_dir, tmp_path / "dev.json", tmp_path / "out.json", RerankScoreConfig(k=2, precision="fp32"),
                        k=4)
    assert stats["k"] == 4 and stats["pairs"] == 12
    with pytest.raises(TypeError, match="kk"):
        rerank_file(ce_dir, tmp_path / "dev.json", tmp_path / "x.json", kk=4)
    assert not (tmp_path / "x.json").exists()
