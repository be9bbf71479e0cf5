"""A trained cross-encoder whose scores cannot tell pairs apart is refused before it is saved: the rule, on a
tiny model with its head zeroed (one score for every pair), and ``train_cross_encoder`` refusing such a run."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from dpr.rerank.collapse import COLLAPSE_SAMPLE, check_scores_vary, distinct_scores, sample_pairs
from tests.tiny_negatives import with_negatives


def _head(model: torch.nn.Module) -> torch.nn.Linear:
    """The one-logit output layer."""
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == 1][-1]


def _collapsed(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with a zero head that does not train: every pair scores the head's bias."""
    head = _head(model)
    with torch.no_grad():
        head.weight.zero_()
    head.weight.requires_grad_(False)
    return model


def test_distinct_scores_counts_values_apart_and_no_non_finite_one():
    assert distinct_scores(torch.tensor([0.5, 0.5, 0.5, 0.5])) == 1
    assert distinct_scores(torch.tensor([0.5, 0.5 + 1e-9, 0.7, -2.0])) == 3  # a rounding apart is one score
    assert distinct_scores(torch.tensor([float("nan"), float("inf"), 1.0])) == 1
    assert distinct_scores(torch.tensor([float("nan")] * 3)) == 0
    assert distinct_scores(torch.tensor([])) == 0


def test_sample_pairs_are_different_pairs_in_file_order(tiny_data_dir):
    examples = json.loads(with_negatives(tiny_data_dir).read_text())
    questions, documents = sample_pairs(examples, None, use_title=False)
    assert len(set(zip(questions, documents))) == len(questions) == min(COLLAPSE_SAMPLE, 2 * len(examples))
    assert (questions[0], documents[0]) == (examples[0]["question"], examples[0]["positive_ctxs"][0]["text"])
    assert documents[1] == examples[0]["hard_negative_ctxs"][0]["text"]


def test_a_constant_scorer_is_refused_and_a_working_one_passes(tiny_model_dir, tiny_data_dir):
    from dpr.rerank.model import build_cross_encoder

    examples = json.loads(with_negatives(tiny_data_dir).read_text())
    torch.manual_seed(0)
    model, tok = build_cross_encoder(str(tiny_model_dir))
    check_scores_vary(model, tok, examples, max_length=64, use_title=True, where="run")  # a random head: passes
    model.train()
    with pytest.raises(ValueError, match=r"^run: the trained cross-encoder gives 1 distinct scores for \d+ different "
                                         r"training \(question, passage\) pairs: .* not marked finished$"):
        check_scores_vary(_collapsed(model), tok, examples, max_length=64, use_title=True, where="run")
    assert model.training  # scored without dropout, then put back as it was
    # too few pairs to judge: no verdict
    check_scores_vary(model, tok, examples[:1], max_length=64, use_title=True, where="run")


def test_training_that_collapses_is_not_saved(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    import dpr.rerank.train as rerank_train
    from dpr.rerank.config import RerankConfig

    train = with_negatives(tiny_data_dir)
    build = rerank_train.build_cross_encoder
    monkeypatch.setattr(rerank_train, "build_cross_encoder", lambda *a, **kw: (
        lambda m, t: (_collapsed(m), t))(*build(*a, **kw)))
    cfg = RerankConfig(model=str(tiny_model_dir), max_length=64)
    cfg.train.max_steps, cfg.train.batch_size, cfg.train.negatives, cfg.train.save_every = 2, 4, 2, 0
    cfg.train.precision = "fp32"
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=f"^{re.escape(str(out))}: the trained cross-encoder gives 1 distinct scores"):
        rerank_train.train_cross_encoder(cfg, train, out, prefetch=0)
    assert not (out / "cross_encoder").exists() and not (out / "train_summary.json").exists()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)  # it did train
