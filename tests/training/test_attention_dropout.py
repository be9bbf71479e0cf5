"""train.attention_dropout (`dpr.models.dropout`): the attention modules' dropout set for training only.

At 0 a train-mode forward is the eval-mode forward (hidden dropout off), eager and SDPA alike; null is the key
absent (same steps, same fingerprint); the saved config.json keeps the base model's value; bad values and models
whose attention it cannot reach are refused in one line.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import BertConfig, BertModel

from dpr.models.dropout import set_attention_dropout
from dpr.training.config import TrainConfig
from dpr.training.resume import run_fingerprint
from dpr.training.train import train
from dpr.trainkit.metrics_log import read_jsonl

# tiny models on a shared 2-core box: one intra-op thread (conftest.one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


def _bert(attn: str) -> BertModel:
    """A tiny random BERT with BERT's attention dropout (0.1) and no hidden dropout: attention is the only draw."""
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=64, hidden_dropout_prob=0.0, attn_implementation=attn)
    return BertModel(cfg)


def _forward(model: BertModel, train_mode: bool) -> torch.Tensor:
    ids = torch.randint(0, 100, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0  # padding: the masked path too
    model.train(train_mode)
    torch.manual_seed(2)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_no_attention_dropout_trains_with_the_eval_forward(attn):
    model = _bert(attn)
    assert model.config._attn_implementation == attn
    want = _forward(model, train_mode=False)
    assert not torch.allclose(_forward(model, train_mode=True), want)  # the model's own 0.1 draws masks
    assert set_attention_dropout(model, 0) == 2  # one per layer
    torch.testing.assert_close(_forward(model, train_mode=True), want, rtol=0, atol=0)
    assert set_attention_dropout(model, 0.1) == 2
    assert not torch.allclose(_forward(model, train_mode=True), want)
    assert model.config.attention_probs_dropout_prob == 0.1  # the config (config.json) is not the lever


def test_both_towers_are_set_once_each(tiny_model_dir):
    from dpr.models import load_biencoder

    separate = load_biencoder(str(tiny_model_dir), shared=False)[0]
    assert set_attention_dropout(separate, 0.0) == 4  # 2 layers x 2 towers
    shared = load_biencoder(str(tiny_model_dir), shared=True)[0]
    assert set_attention_dropout(shared, 0.0) == 2
    probs = {m.dropout.p for m in separate.modules() if type(m).__name__ == "BertSelfAttention"}
    assert probs == {0.0}
    hidden = {m.p for name, m in separate.named_modules() if isinstance(m, nn.Dropout) and "self.dropout" not in name}
    assert hidden == {0.1}  # hidden-state dropout untouched


@pytest.mark.parametrize("bad", [1.0, -0.1, float("nan")])
def test_bad_values_are_refused_in_one_line(bad):
    with pytest.raises(ValueError, match="train.attention_dropout must be") as err:
        TrainConfig.from_dict({"attention_dropout": bad})
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="train.attention_dropout must be"):
        set_attention_dropout(_bert("eager"), bad)


def test_a_model_without_reachable_attention_dropout_is_refused():
    class NoAttention(nn.Module):  # a dropout, but no attention module whose forward reads it
        def __init__(self) -> None:
            super().__init__()
            self.dense, self.dropout = nn.Linear(4, 4), nn.Dropout(0.1)

    with pytest.raises(ValueError, match="train.attention_dropout: no attention module") as err:
        set_attention_dropout(NoAttention(), 0.0)
    assert "\n" not in str(err.value)


def test_fingerprint_records_it_only_when_set(tmp_path):
    train_file = tmp_path / "train.json"
    train_file.write_text("[]")
    conf = {"model": {"name": "m"}, "data": {"name": "d"}, "seed": 1}

    def fp(train_cfg: dict) -> str:
        return run_fingerprint(conf, train_cfg, train_file, 1)

    before = {k: v for k, v in dataclasses.asdict(TrainConfig()).items() if k != "attention_dropout"}  # an old run
    assert fp(dataclasses.asdict(TrainConfig.from_dict({}))) == fp(before)
    assert fp(dataclasses.asdict(TrainConfig.from_dict({"attention_dropout": None}))) == fp(before)
    zero = fp(dataclasses.asdict(TrainConfig.from_dict({"attention_dropout": 0.0})))
    assert zero != fp(before) and zero != fp(dataclasses.asdict(TrainConfig.from_dict({"attention_dropout": 0.05})))


def _cfg(model_dir: Path, data_dir: Path, out: Path, **train_kw) -> dict:
    return {"model": {"name": str(model_dir), "pooling": "mean", "question_max_length": 32, "passage_max_length": 64},
            "data": {"name": "tiny", "kind": "qa"}, "logger": {"type": "none"}, "data_dir": str(data_dir),
            "output_dir": str(out), "seed": 5,
            "train": {"batch_size": 3, "hard_negatives": 1, "max_steps": 2, "save_every": 1, "lr": 1e-3,
                      "print_every": 1000, "validate": False, "precision": "fp32", **train_kw}}


def _losses(out: Path) -> list[float]:
    return [r["loss"] for r in read_jsonl(out / "metrics.jsonl")]


def _tower(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "passage_encoder" / "model.safetensors"))


def test_null_is_the_key_absent_and_the_saved_config_keeps_the_model_value(tiny_model_dir, tiny_data_dir, tmp_path):
    absent = tmp_path / "absent"
    train(_cfg(tiny_model_dir, tiny_data_dir, absent))
    null = tmp_path / "null"
    train(_cfg(tiny_model_dir, tiny_data_dir, null, attention_dropout=None))
    assert _losses(null) == _losses(absent) and all(math.isfinite(v) for v in _losses(absent))
    a, b = _tower(absent), _tower(null)
    assert all(torch.equal(a[k], b[k]) for k in a)
    state = lambda out: json.loads((out / "checkpoints" / "step_2" / "state.json").read_text())  # noqa: E731
    assert state(null)["fingerprint"] == state(absent)["fingerprint"]

    off = tmp_path / "off"
    train(_cfg(tiny_model_dir, tiny_data_dir, off, attention_dropout=0.0))
    assert _losses(off) != _losses(absent)  # no attention masks drawn: another step
    base = json.loads((tiny_model_dir / "config.json").read_text())["attention_probs_dropout_prob"]
    for tower in ("question_encoder", "passage_encoder"):
        saved = json.loads((off / tower / "config.json").read_text())
        assert saved["attention_probs_dropout_prob"] == base == 0.1
    card = (off / "README.md").read_text()
    assert "| attention dropout (training only) | 0 |" in card
    assert "attention dropout" not in (absent / "README.md").read_text()
    assert state(off)["fingerprint"] != state(absent)["fingerprint"]


def test_a_resume_with_another_value_is_refused(tiny_model_dir, tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    train(_cfg(tiny_model_dir, tiny_data_dir, out, attention_dropout=0.0, max_steps=1))
    with pytest.raises(ValueError, match="another model/data/train config"):
        train(_cfg(tiny_model_dir, tiny_data_dir, out, attention_dropout=0.05, resume=True))
    s = train(_cfg(tiny_model_dir, tiny_data_dir, out, attention_dropout=0.0, resume=True))
    assert s["resumed_from"].endswith("step_1") and s["steps"] == 2


def test_hydra_key_and_the_pipeline_stage_params():
    """``train.attention_dropout=0`` on the command line is 0.0; while null the pipeline's train stage params (its
    fingerprint) hold no such key, as before it existed (dpr/pipeline.py: ``without_unset``)."""
    from hydra import compose, initialize_config_dir

    import dpr.cli.pipeline  # noqa: F401  registers every group the pipeline composes
    from dpr.cli.common import CONF_DIR
    from dpr.training.config import register_schema, without_unset
    from dpr.training.rounds import split_rounds
    from dpr.trainkit.config_dict import plain

    register_schema()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        default = plain(compose(config_name="pipeline").train)
        zero = plain(compose(config_name="pipeline", overrides=["train.attention_dropout=0"]).train)
    assert default["attention_dropout"] is None and "attention_dropout" not in without_unset(default)
    # (the keys of the data path are in no fingerprint; length_bucket_size=auto is recorded as the CPU's 8)
    assert without_unset(default, "cpu") == {**{k: v for k, v in default.items() if k not in (
        "attention_dropout", "background_loader", "token_cache", "matryoshka_dims", "matryoshka_weights",
        "matryoshka_distill",
        "projection_init", "other_negatives", "corpus_sample")},
        "length_bucket_size": 8}
    assert zero["attention_dropout"] == 0.0 and without_unset(zero)["attention_dropout"] == 0.0
    assert TrainConfig.from_dict(split_rounds(zero)[1]).attention_dropout == 0.0  # train.rounds: the pipeline's
