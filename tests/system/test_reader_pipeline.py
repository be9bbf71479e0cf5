"""`dpr-pipeline … reader=true` on the tiny dataset: the report's `reader` key, markdown and plot."""

from __future__ import annotations

import json

import pytest

from tests.system.test_pipeline import _pipeline


def _with_reader(tiny_model_dir, *extra: str) -> list[str]:
    """The pipeline test's tiny run (later overrides win), reading the top 20 with a tiny reader."""
    return ["retrieve.k=20", "encode.batch_size=8", *extra, "reader=true", f"reader_cfg.model={tiny_model_dir}",
            "reader_cfg.max_length=64", "reader_cfg.train.max_steps=2", "reader_cfg.train.batch_size=4",
            "reader_cfg.train.save_every=0"]


@pytest.mark.slow
def test_pipeline_with_reader_reports_bound_and_reader_side_by_side(tiny_data_dir, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, *_with_reader(tiny_model_dir), in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "eval" / "report.json").read_text())
    reader = report["reader"]
    assert set(reader) == {"gold", "systems"}
    assert set(reader["gold"]) == {"em", "f1"}
    assert set(reader["systems"]) == {"bm25", "dense", "hybrid"}
    for per_k in reader["systems"].values():
        assert set(per_k) == {"1", "5", "20"}
        for fig in per_k.values():
            assert set(fig) == {"em", "f1"} and 0.0 <= fig["em"] <= fig["f1"] <= 1.0
    # the tiny set has no test gold file: the gold passages are BM25's first answer-bearing ones
    assert "pseudo-gold" in report["notes"]["reader"]["gold_passages"]
    md = (out / "eval" / "report.md").read_text()
    assert "## Reader" in md and "top-k (bound)" in md and "EM above bound" in md
    timings = json.loads((out / "timings.json").read_text())["seconds"]
    assert {"reader_train", "reader_eval"} <= set(timings)
    eval_out = json.loads((out / "reader" / "eval.json").read_text())
    assert len(eval_out["predictions"]["dense"]["5"]) == 8


@pytest.mark.slow
def test_with_a_teacher_the_reader_also_reads_the_reranked_lists(tiny_data_dir, tiny_model_dir, tmp_path):
    from tests.system.test_pipeline_teacher import RERANKED, _teacher

    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out,
                     *_with_reader(tiny_model_dir, *_teacher(tiny_model_dir, "teacher.distill=false")), in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "eval" / "report.json").read_text())
    assert set(report["reader"]["systems"]) == {"bm25", "dense", "hybrid", *RERANKED}
    eval_out = json.loads((out / "reader" / "eval.json").read_text())
    assert len(eval_out["predictions"]["hybrid+rerank"]["1"]) == len(json.loads(
        (out / "rerank" / "hybrid" / "test.json").read_text()))
