"""LoRA and Matryoshka through the trainer: with the gradient cache, the frozen-index phase and a distillation loss
(BM25 as teacher) a LoRA run trains its adapters alone; the gradient cache gives the plain step's adapters; a
Matryoshka run trains and names a size beyond the model in one line."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from dpr.training.train import train
from tests.training.test_resume import tiny_cfg

pytestmark = pytest.mark.usefixtures("one_thread")
LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def _cfg(model_dir, data_dir, out, **train_kw):
    cfg = tiny_cfg(model_dir, data_dir, out, precision="fp32", max_steps=4, save_every=0, **train_kw)
    cfg["model"].update(pooling="last", lora=LORA)
    return cfg


def test_lora_with_the_gradient_cache_frozen_phase_and_distillation(tiny_llama_dir, tiny_data_dir, tmp_path):
    base = load_file(str(tiny_llama_dir / "model.safetensors"))
    plain = _cfg(tiny_llama_dir, tiny_data_dir, tmp_path / "plain")
    cached = _cfg(tiny_llama_dir, tiny_data_dir, tmp_path / "cached", grad_cache_chunk_size=2)
    train(plain)
    train(cached)
    for tower in ("question_encoder", "passage_encoder"):  # the gradient cache: the same adapters (fp32, 1e-5)
        a = load_file(str(tmp_path / "plain" / tower / "adapter_model.safetensors"))
        b = load_file(str(tmp_path / "cached" / tower / "adapter_model.safetensors"))
        assert a.keys() == b.keys() and a
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-5)
    frozen = _cfg(tiny_llama_dir, tiny_data_dir, tmp_path / "frozen", frozen_steps=2)
    frozen["loss"] = {"_target_": "dpr.losses.LexicalDistillLoss"}
    summary = train(frozen)
    assert summary["steps"] == 6  # 2 frozen-index steps, then max_steps
    assert (tmp_path / "frozen" / "question_encoder" / "adapter_model.safetensors").is_file()
    assert load_file(str(tiny_llama_dir / "model.safetensors")).keys() == base.keys()  # the base is never written


def test_matryoshka_training_runs_and_checks_its_sizes(tiny_model_dir, tiny_data_dir, tmp_path):
    cfg = tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "mrl", precision="fp32", max_steps=2, save_every=0,
                   matryoshka_dims=[32, 16, 8], matryoshka_weights=[1.0, 1.0, 0.5])
    assert train(cfg)["steps"] == 2
    bad = tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "bad", precision="fp32", max_steps=1, save_every=0,
                   matryoshka_dims=[64])
    with pytest.raises(ValueError, match="32 dimensions"):
        train(bad)
