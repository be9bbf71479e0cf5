"""Partial fine-tuning: the bottom of the passage tower frozen (train.passage_frozen_layers)."""

from __future__ import annotations

import pytest
import torch

from dpr.models import load_biencoder
from dpr.models.freeze import freeze_bottom_layers, transformer_layers
from dpr.training.train import train
from tests.training.test_trainer import tiny_cfg


# tiny models on a shared 2-core box: one intra-op thread (conftest.one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


def _trainable(module) -> set[str]:
    return {n for n, p in module.named_parameters() if p.requires_grad}


def test_freezes_exactly_the_embeddings_and_the_first_n_layers(tiny_model_dir):
    model, _ = load_biencoder(str(tiny_model_dir), pooling="mean")
    enc = model.passage_encoder
    before = _trainable(enc)
    frozen = freeze_bottom_layers(enc, 1)
    after = _trainable(enc)
    gone = before - after
    assert gone and all(n.startswith(("embeddings.", "encoder.layer.0.")) for n in gone)
    assert {n for n in before if n.startswith(("embeddings.", "encoder.layer.0."))} == gone
    assert frozen == sum(p.numel() for n, p in enc.named_parameters() if n in gone)
    assert _trainable(model.question_encoder) == before  # the other tower is untouched
    assert len(transformer_layers(enc)) == 2
    assert freeze_bottom_layers(enc, 0) == 0 and _trainable(enc) == after
    with pytest.raises(ValueError, match="cannot freeze 3 layers of a 2-layer encoder"):
        freeze_bottom_layers(enc, 3)


def test_backward_stops_at_the_first_trained_layer(tiny_model_dir):
    model, tok = load_biencoder(str(tiny_model_dir), pooling="mean")
    freeze_bottom_layers(model.passage_encoder, 1)
    p = tok(["a passage about paris", "another one"], return_tensors="pt", padding=True)
    q = tok(["where is paris"], return_tensors="pt")
    qv, pv = model(q, p)
    (qv @ pv.T).sum().backward()
    grads = {n: prm.grad for n, prm in model.passage_encoder.named_parameters()}
    assert all(g is None for n, g in grads.items() if n.startswith(("embeddings.", "encoder.layer.0.")))
    assert all(g is not None for n, g in grads.items() if n.startswith("encoder.layer.1."))


@pytest.mark.precision  # compares numbers under auto: runs under both rules in .ci/run
def test_training_leaves_the_frozen_layers_as_they_were(tiny_model_dir, tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=3, validate=False, passage_frozen_layers=1))
    start, _ = load_biencoder(str(tiny_model_dir), pooling="mean")
    end, _ = load_biencoder(out)
    s_p, e_p = dict(start.passage_encoder.named_parameters()), dict(end.passage_encoder.named_parameters())
    s_q, e_q = dict(start.question_encoder.named_parameters()), dict(end.question_encoder.named_parameters())
    for name in s_p:
        if name.startswith(("embeddings.", "encoder.layer.0.")):
            assert torch.equal(s_p[name], e_p[name]), name
    assert not torch.equal(s_p["encoder.layer.1.output.dense.weight"], e_p["encoder.layer.1.output.dense.weight"])
    assert not torch.equal(s_q["encoder.layer.0.output.dense.weight"], e_q["encoder.layer.0.output.dense.weight"])


def test_shared_towers_are_refused(tiny_model_dir, tiny_data_dir, tmp_path):
    cfg = tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "run", max_steps=1, validate=False,
                   passage_frozen_layers=1)
    cfg["model"]["shared"] = True
    with pytest.raises(ValueError, match="passage_frozen_layers needs separate towers"):
        train(cfg)


def test_negative_layer_count_is_refused():
    from dpr.training.config import TrainConfig

    with pytest.raises(ValueError, match=r"train.passage_frozen_layers must be an integer >= 0 \(0: none frozen\), got -1"):
        TrainConfig.from_dict({"passage_frozen_layers": -1})
