"""``train.projection_init=pca``: the projection starts as the passages' principal directions; at the model's size
it is a rotation (every score unchanged), its coordinates ordered by the share of the passages they carry."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from dpr.models import encode_texts, load_biencoder
from dpr.training.config import TrainConfig, without_unset
from dpr.training.projection_init import init_projection_pca, pca_rotation, sample_passages
from dpr.training.train import train
from tests.conftest import TINY_PASSAGES
from tests.training.test_resume import tiny_cfg


def test_pca_rotation_is_orthonormal_ordered_and_spans_the_top_directions():
    g = torch.Generator().manual_seed(0)
    scale = torch.tensor([5.0, 3.0, 2.0, 1.0, 0.5, 0.1])
    basis, _ = torch.linalg.qr(torch.randn(6, 6, generator=g))
    v = (torch.randn(500, 6, generator=g) * scale) @ basis.T
    rot, share = pca_rotation(v)
    assert torch.allclose(rot.T @ rot, torch.eye(6), atol=1e-5)
    var = ((v @ rot) ** 2).mean(0)
    assert torch.all(var[:-1] >= var[1:])  # coordinates by decreasing second moment
    assert torch.all(share[1:] >= share[:-1]) and share[-1] == pytest.approx(1.0)
    # the first two columns span the two largest directions of the construction
    top = basis[:, :2]
    assert torch.linalg.matrix_norm(top - rot[:, :2] @ (rot[:, :2].T @ top)) < 0.1
    again, _ = pca_rotation(v)
    assert torch.equal(rot, again)  # one answer: signs fixed


def test_sample_passages_is_distinct_and_in_file_order():
    ex = [{"positive_ctxs": [{"passage_id": "a", "title": "A", "text": "x"}],
           "hard_negative_ctxs": [{"passage_id": "b", "title": "", "text": "y"}]},
          {"positive_ctxs": [{"passage_id": "b", "title": "", "text": "y"}],
           "hard_negative_ctxs": [{"passage_id": "c", "title": "C", "text": "z"}]}]
    assert sample_passages(ex) == (["A", "", "C"], ["x", "y", "z"])
    assert sample_passages(ex, limit=2) == (["A", ""], ["x", "y"])


@pytest.mark.parametrize("shared", [False, True])
def test_at_the_model_size_every_score_is_unchanged_and_coordinates_are_ordered(tiny_model_dir, shared):
    model, tok = load_biencoder(str(tiny_model_dir), pooling="mean", similarity="cosine", shared=shared,
                                projection_dim=32)
    examples = [{"positive_ctxs": [{"passage_id": pid, "title": title, "text": text}], "hard_negative_ctxs": []}
                for pid, text, title in TINY_PASSAGES]
    texts, titles = [t for _, t, _ in TINY_PASSAGES], [ti for _, _, ti in TINY_PASSAGES]
    qs = ["capital of france", "highest mountain", "water boils"]
    for proj in {id(p): p for p in (model.question_projection, model.passage_projection)}.values():
        with torch.no_grad():  # the reference: no rotation at all
            proj.weight.copy_(torch.eye(32))
            proj.bias.zero_()
    before_p = encode_texts(model, tok, texts, "passage", titles=titles, autocast="off")
    before_q = encode_texts(model, tok, qs, "question", autocast="off")
    info = init_projection_pca(model, tok, examples, device="cpu")
    assert info["passages"] == len(TINY_PASSAGES) and info["dim"] == 32
    after_p = encode_texts(model, tok, texts, "passage", titles=titles, autocast="off")
    after_q = encode_texts(model, tok, qs, "question", autocast="off")
    assert torch.allclose(after_q @ after_p.T, before_q @ before_p.T, atol=1e-5)
    assert not torch.allclose(after_p, before_p, atol=1e-3)  # the coordinates did move
    var = (after_p ** 2).mean(0)
    assert torch.all(var[:-1] >= var[1:] - 1e-6)
    assert torch.equal(model.question_projection.weight, model.passage_projection.weight)


def test_refusals_are_one_line(tiny_model_dir):
    with pytest.raises(ValueError, match="projection_init must be null or one of pca"):
        TrainConfig.from_dict({"projection_init": "svd"})
    with pytest.raises(ValueError, match="needs train.frozen_steps=0"):
        TrainConfig.from_dict({"projection_init": "pca", "frozen_steps": 5})
    model, tok = load_biencoder(str(tiny_model_dir), pooling="mean")
    with pytest.raises(ValueError, match="set model.projection_dim"):
        init_projection_pca(model, tok, [], device="cpu")


def test_a_run_starts_from_the_rotation_and_a_resume_keeps_its_weights(tiny_model_dir, tiny_data_dir, tmp_path,
                                                                         monkeypatch):
    """Through dpr-train: the first logged loss equals a run without a projection (a rotation changes no score; the
    same seed draws the same dropout masks); a resumed run takes its weights from the checkpoint, not a new PCA."""
    cfg = tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "rot", max_steps=2, save_every=2, validate=False,
                   precision="fp32", projection_init="pca")
    cfg["model"].update(projection_dim=32, similarity="cosine")
    train(cfg)
    plain = tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "plain", max_steps=2, save_every=0, validate=False,
                     precision="fp32")
    plain["model"].update(similarity="cosine")
    train(plain)

    def first_loss(out):
        return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["loss"]

    assert first_loss(tmp_path / "rot") == pytest.approx(first_loss(tmp_path / "plain"), abs=1e-4)

    def no_second_pca(*a, **k):
        raise AssertionError("a resumed run re-initialised its projection")

    monkeypatch.setattr("dpr.training.projection_init.init_projection_pca", no_second_pca)
    assert train(cfg)["resumed_from"].endswith("step_2")


def test_the_key_is_fingerprinted_only_when_set():
    base = dataclasses.asdict(TrainConfig())
    assert "projection_init" not in without_unset(base)  # runs from before the key stay the same run
    assert without_unset({**base, "projection_init": "pca"})["projection_init"] == "pca"
