"""`dpr-pipeline … teacher=true` with a LoRA cross-encoder (``teacher.rerank.model.lora``): the teacher trains
adapters and head only, its scores are distilled from and it reranks every first stage as a fully trained one does;
a rerun skips every stage, and switching LoRA off retrains the teacher."""

from __future__ import annotations

import json

import pytest
from tests.system.test_pipeline import _pipeline
from tests.system.test_pipeline_teacher import TEACHER_STAGES, _check_rerank_order, _check_same_keys, _ran, _teacher

LORA = "teacher.rerank.model.lora={r: 4, alpha: 8, dropout: 0.0}"


@pytest.mark.slow
def test_a_lora_teacher_runs_the_teacher_stages_and_reruns_nothing(tiny_data_dir, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, *_teacher(tiny_model_dir, LORA))
    assert proc.returncode == 0, proc.stderr[-3000:]
    teacher = out / "teacher" / "cross_encoder"
    assert (teacher / "encoder" / "adapter_model.safetensors").is_file()
    assert not (teacher / "encoder" / "model.safetensors").exists()
    assert json.loads((teacher / "cross_encoder.json").read_text())["lora"]["r"] == 4
    report = json.loads((out / "eval" / "report.json").read_text())
    _check_same_keys(report)
    _check_rerank_order(out, tiny_data_dir / "tiny")  # the reranked lists are the LoRA model's logits
    assert TEACHER_STAGES <= _ran(out)

    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, *_teacher(tiny_model_dir, LORA), in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _ran(out) == set()

    # without LoRA: another teacher (its stage's settings changed), trained whole
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, *_teacher(tiny_model_dir), in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "teacher_train" in _ran(out) and (teacher / "encoder" / "model.safetensors").is_file()
