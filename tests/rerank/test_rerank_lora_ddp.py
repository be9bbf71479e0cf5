"""A LoRA cross-encoder trains data-parallel under gloo (`dpr.trainkit.data_parallel`): 2 processes give the
1-process run's losses and adapters (the tiny BERT without dropout, adapter dropout 0)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from tests.tiny_negatives import with_negatives
from tests.trainkit.test_data_parallel import _rows, _same_weights, _torchrun

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["query", "value"]}


@pytest.mark.slow
def test_lora_cross_encoder_two_processes_equal_one(tiny_model_no_dropout, tiny_data_dir, tmp_path):
    from dpr.rerank.config import RerankConfig
    from dpr.rerank.train import train_cross_encoder

    train = with_negatives(tiny_data_dir)
    work = tmp_path / "cwd"
    work.mkdir()
    ddp = tmp_path / "ddp"
    settings = {"max_length": 64, "train": {"batch_size": 3, "negatives": 2, "lr": 1e-4, "max_steps": 4,
                                            "save_every": 2, "precision": "fp32", "warmup_ratio": 0.0}}
    _torchrun("dpr.cli.rerank", ["train", "data.name=tiny", f"data_dir={tiny_data_dir}", f"output_dir={ddp}",
                                 f"model={tiny_model_no_dropout}",
                                 "rerank.model.lora={r: 4, alpha: 8, dropout: 0.0, target_modules: [query, value]}",
                                 "rerank.max_length=64", "rerank.train.batch_size=3", "rerank.train.negatives=2",
                                 "rerank.train.lr=1e-4", "rerank.train.max_steps=4", "rerank.train.save_every=2",
                                 "rerank.train.precision=fp32", "rerank.train.warmup_ratio=0.0"], work)
    cfg = RerankConfig.from_dict({"model": {"name": str(tiny_model_no_dropout), "lora": LORA}, **settings})
    train_cross_encoder(cfg, train, tmp_path / "one")

    summary = json.loads((ddp / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4
    assert summary["fingerprint"] == json.loads((tmp_path / "one" / "train_summary.json").read_text())["fingerprint"]
    ddp_rows, one_rows = _rows(ddp / "metrics.jsonl"), _rows(tmp_path / "one" / "metrics.jsonl")
    assert [r["loss"] for r in ddp_rows] == pytest.approx([r["loss"] for r in one_rows], abs=1e-5)
    adapters = "cross_encoder/encoder/adapter_model.safetensors"
    a, b = load_file(str(ddp / adapters)), load_file(str(tmp_path / "one" / adapters))
    # the listwise loss ignores a bias shared by the group: its exact gradient is 0, its steps rounding noise
    _same_weights(a, b, noise_only=("base_model.model.classifier.bias",))
    for k in (k for k in a if "lora_B" in k):  # the adapters' updates are small: compared to their own size too
        assert (a[k] - b[k]).abs().max() <= 1e-3 * b[k].abs().max() + 1e-8, k
    assert any("classifier" in k for k in a) and any(not torch.equal(v, torch.zeros_like(v))
                                                    for k, v in a.items() if "lora_B" in k)
    assert list(work.iterdir()) == []  # no rank wrote anywhere else
