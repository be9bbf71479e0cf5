"""Decoder-only LLM retrievers end to end: tiny random Llama and Qwen2 models through `dpr-pipeline` (train ->
encode -> index -> retrieve -> eval) with the presets (LoRA on, instruction prefix, last-token / EOS pooling), then
`dpr-export` to sentence-transformers; a second run finds every stage up to date."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.run_command import run_as_subprocess, run_command

BIN = Path(sys.executable).parent


def _pipeline(data_dir: Path, model_dir: Path, out: Path, preset: str) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "dpr-pipeline"), f"model={preset}", f"model.name={model_dir}", "model.dtype=fp32",
           "model.gradient_checkpointing=false", "model.lora.r=4", "model.lora.target_modules=[q_proj,v_proj]",
           "data.name=tiny", "data.kind=qa", "data.recipe=none", f"data_dir={data_dir}", f"output_dir={out}",
           "train.max_steps=4", "train.batch_size=4", "train.hard_negatives=1", "train.save_every=0",
           "train.val_max_questions=4", "train.lr=1e-3", "bm25.num_negatives=3", "retrieve.k=5", "encode.batch_size=4"]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return run_as_subprocess(cmd, env=env)  # in this process: the runs are about what the stages write


@pytest.mark.slow
@pytest.mark.parametrize("family,preset", [("llama", "llama"), ("qwen2", "qwen2")])
def test_decoder_presets_through_the_pipeline_and_export(family, preset, tiny_data_dir, tmp_path):
    from tests.conftest import build_tiny_decoder

    model_dir = build_tiny_decoder(tmp_path / f"tiny_{family}", family)
    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, model_dir, out, preset)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "eval" / "report.json").read_text())
    assert {"dense_untrained", "dense"} <= set(report["systems"])
    trained = out / "model"
    doc = json.loads((trained / "biencoder.json").read_text())
    assert doc["config"]["lora"]["r"] == 4 and doc["config"]["pooling"] == {"llama": "eos", "qwen2": "last"}[family]
    assert not (trained / "question_encoder" / "model.safetensors").exists()  # adapters, not a copy of the base

    proc = _pipeline(tiny_data_dir, model_dir, out, preset)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {"train", "dense_encode", "dense_index"} <= set(json.loads((out / "timings.json").read_text())["skipped"])

    # check=true: the copy's vectors compared with the run's (EOS pooling: EOS appended by the copy's tokenizer)
    export = run_command(["dpr-export", f"model={trained}", "format=sentence-transformers",
                          f"output={tmp_path / 'st'}", "check=true"])
    assert export.returncode == 0, export.stderr[-3000:]
    assert (tmp_path / "st" / "modules.json").is_file()
    check = json.loads(next(line for line in export.stdout.splitlines() if line.startswith("dpr-export: check "))
                       .removeprefix("dpr-export: check "))
    assert check["max_abs_diff"] <= 1e-4 and check["same_topk_order"] == check["questions"], check
