"""A LoRA run resumes only on the base its adapters were trained on. Before, replacing the files at ``model.name``
and running the same command again resumed the old adapters on the new base and stamped them with the new base's
fingerprint, so even the load-time base check passed. Now the resume is refused in one line; ``train.resume=false``
starts over on the new base; the same base resumes as before."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from dpr.training.resume import BASE_FILE
from tests.tiny_negatives import with_negatives
from tests.training.test_resume import tiny_cfg

pytestmark = pytest.mark.usefixtures("one_thread")


def _change_weights(base: Path) -> None:
    weights = load_file(str(base / "model.safetensors"))
    save_file({k: v + 0.01 for k, v in weights.items()}, str(base / "model.safetensors"))


def test_the_retriever_refuses_to_resume_adapters_on_a_changed_base(tiny_llama_dir, tiny_data_dir, tmp_path):
    from dpr.training.train import train

    base = tmp_path / "base"
    shutil.copytree(tiny_llama_dir, base)
    cfg = tiny_cfg(base, tiny_data_dir, tmp_path / "run", precision="fp32", max_steps=2, save_every=2)
    cfg["model"].update(pooling="last", lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"]})
    train(cfg)
    assert (tmp_path / "run" / BASE_FILE).is_file()
    cfg["train"]["max_steps"] = 4  # the same run, continued
    _change_weights(base)
    marker = (tmp_path / "run" / "biencoder.json").read_bytes()
    with pytest.raises(ValueError, match=r"step_2: its LoRA adapters were trained on another base model") as err:
        train(cfg)
    assert "\n" not in str(err.value)
    assert (tmp_path / "run" / "biencoder.json").read_bytes() == marker  # the finished run is as it was
    cfg["train"]["resume"] = False  # starting over on the new base is allowed
    assert train(cfg)["resumed_from"] is None


def test_the_same_base_still_resumes(tiny_llama_dir, tiny_data_dir, tmp_path):
    from dpr.training.train import train

    cfg = tiny_cfg(tiny_llama_dir, tiny_data_dir, tmp_path / "run", precision="fp32", max_steps=2, save_every=2)
    cfg["model"].update(pooling="last", lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"]})
    train(cfg)
    cfg["train"]["max_steps"] = 3
    assert train(cfg)["resumed_from"].endswith("step_2")


def test_the_cross_encoder_refuses_it_too(tiny_model_dir, tiny_data_dir, tmp_path):
    from dpr.rerank.config import RerankConfig
    from dpr.rerank.train import train_cross_encoder

    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    train_file = with_negatives(tiny_data_dir)
    cfg = RerankConfig.from_dict({"model": {"name": str(base), "lora": {"r": 4, "alpha": 8, "dropout": 0.0,
                                                                        "target_modules": ["query", "value"]}},
                                  "max_length": 64})
    cfg.train.max_steps, cfg.train.batch_size, cfg.train.negatives, cfg.train.save_every = 2, 4, 2, 2
    cfg.train.precision = "fp32"
    assert train_cross_encoder(cfg, train_file, tmp_path / "ce")["resumed_from_step"] == 0
    cfg.train.max_steps = 3
    _change_weights(base)
    with pytest.raises(ValueError, match=r"step_2: its LoRA adapters were trained on another base model"):
        train_cross_encoder(cfg, train_file, tmp_path / "ce")
