"""Training a whole model in bf16 weights rounds most of AdamW's updates away: refused in one line before any work,
with the two ways that train (fp32 weights, or LoRA adapters). Before, dpr-train ran and changed ~1 % of a tiny
BERT's weights in 10 steps, exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpr.models.backbone import check_trainable_dtype
from tests.run_command import run_as_subprocess

BIN = Path(sys.executable).parent


def test_bf16_weights_lose_small_updates():
    """Why it is refused: an update below half a bf16 step of the weight leaves the weight unchanged."""
    w = torch.full((1000,), 0.5, dtype=torch.bfloat16)
    assert torch.equal(w + 1e-4, w)  # AdamW's first step is about lr: 1e-4 here
    assert not torch.equal(w.float() + 1e-4, w.float())


def test_the_check_refuses_bf16_without_lora_only():
    with pytest.raises(ValueError, match="model.dtype=bf16 trains only LoRA adapters") as err:
        check_trainable_dtype("bf16", None)
    assert "\n" not in str(err.value)
    check_trainable_dtype("bf16", {"r": 4})
    check_trainable_dtype("fp32", None)


def _conf(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    return conf


@pytest.mark.parametrize("command", ["dpr-train", "dpr-pipeline"])
def test_commands_refuse_it_before_any_work(tmp_path, tiny_model_dir, tiny_data_dir, command):
    out = tmp_path / "run"
    proc = run_as_subprocess([str(BIN / command), "--config-dir", str(_conf(tmp_path)), "data=tiny",
                              f"data_dir={tiny_data_dir}", f"output_dir={out}", "model=tiny",
                              f"model.name={tiny_model_dir}", "model.dtype=bf16", "train.max_steps=2"],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path,
                             env={**os.environ, "WANDB_MODE": "disabled"})
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(command)]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "model.dtype=bf16 trains only LoRA adapters" in lines[0]
    assert not (out / "train_summary.json").exists() and not (out / "checkpoints").exists()
    assert not (out / "stages").exists() and not (out / "bm25").exists()
