"""A NaN or infinite first-stage score never reaches a ranking: refused where results are read,
naming the file, question and passage, and by every fusion entry point given results in memory. Before,
min-max over a NaN was NaN and ``nan > nan`` is false, so that question's whole BM25 term became 0."""

from __future__ import annotations

import json
import math

import pytest

from dpr.errors import DataError
from dpr.retrieval.fusion import fuse_linear, fuse_ranked, fuse_rrf, tune_linear_weight


def _result(question: str, scores: dict[str, float]) -> dict:
    return {"question": question, "answers": ["x"],
            "ctxs": [{"id": pid, "title": "", "text": f"text {pid}", "score": s, "has_answer": pid == "a"}
                     for pid, s in scores.items()]}


def _files(tmp_path, bad: float):
    bm25 = [_result("q1", {"a": 10.0, "b": 6.0}), _result("q2", {"a": 3.0, "c": bad, "b": 1.0})]
    dense = [_result("q1", {"b": 1.0, "a": 0.5}), _result("q2", {"b": 0.9, "a": 0.1})]
    paths = tmp_path / "bm25.json", tmp_path / "dense.json"
    # json.dumps writes NaN / Infinity, as Python and numpy writers do
    paths[0].write_text(json.dumps(bm25))
    paths[1].write_text(json.dumps(dense))
    return paths, bm25, dense


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_score_in_a_results_file_is_refused_naming_file_question_and_passage(tmp_path, bad):
    (bm25, dense), _, _ = _files(tmp_path, bad)
    for call in (lambda: fuse_linear(bm25, dense, 1.0, k=5), lambda: fuse_rrf(bm25, dense, k=5),
                 lambda: tune_linear_weight(bm25, dense, grid=[0.5, 1.0], metric_k=1)):
        with pytest.raises(DataError) as err:
            call()
        msg = str(err.value)
        assert msg.startswith(f"{bm25}:record 1: field 'ctxs[1].score':"), msg
        assert "'q2'" in msg and "'c'" in msg and "not a finite number" in msg and "\n" not in msg


def test_non_finite_score_in_memory_is_refused_by_every_fusion_entry_point(tmp_path):
    _, bm25, dense = _files(tmp_path, math.nan)
    for call in (lambda: fuse_linear(bm25, dense, 1.0, k=5), lambda: fuse_rrf(bm25, dense, k=5),
                 lambda: tune_linear_weight(bm25, dense, grid=[0.5, 1.0], metric_k=1)):
        with pytest.raises(ValueError, match=r"BM25 score nan is not a finite number \(question 'q2', passage 'c'\)"):
            call()
    # the per-question rule (HybridRetriever's): before, minmax zeroed the whole BM25 list and fused anyway
    with pytest.raises(ValueError, match=r"dense score nan is not a finite number \(passage 'x'\)"):
        fuse_ranked([("a", 1.0)], [("x", math.nan), ("a", 0.5)], 5, weight=1.0)
    runs = {"q": {"a": 2.0, "b": math.inf}}, {"q": {"a": 1.0}}
    with pytest.raises(ValueError, match=r"BM25 score inf is not a finite number \(question 'q', passage 'b'\)"):
        fuse_linear(*runs, 1.0, k=5)


def test_trec_run_with_an_infinite_score_is_refused(tmp_path):
    run = tmp_path / "bm25.trec"
    run.write_text("q1 Q0 d1 1 2.5 bm25\nq1 Q0 d2 2 -inf bm25\n")
    dense = tmp_path / "dense.trec"
    dense.write_text("q1 Q0 d1 1 0.5 dense\n")
    with pytest.raises(DataError, match=r"bm25\.trec:2: field 'score': score -inf is not a finite number "
                                        r"\(query 'q1', document 'd2'\)"):
        fuse_linear(run, dense, 1.0, k=5)
