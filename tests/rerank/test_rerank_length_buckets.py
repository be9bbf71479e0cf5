"""``rerank.train.length_bucket_size``: the cross-encoder's training forward in length-sorted chunks gives the
one-forward logits, loss and gradients (float rounding apart), in the rows' own order."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dpr.rerank.config import RerankConfig
from dpr.rerank.data import Group, collate
from dpr.rerank.losses import LOSSES
from dpr.rerank.model import build_cross_encoder
from dpr.rerank.train import forward_logits

TEXTS = ["Honolulu is the capital of Hawaii and lies on the island of Oahu, in the middle of the Pacific.",
         "Paris is the capital of France.", "Oahu.", "The Eiffel Tower stands in Paris, on the Champ de Mars, "
         "and was built for the 1889 World's Fair by Gustave Eiffel's company.", "Rome is in Italy.",
         "Mount Everest is the highest mountain above sea level, in the Himalayas."]


def _groups() -> list[Group]:
    ctx = [{"passage_id": str(i), "title": f"t{i}", "text": t} for i, t in enumerate(TEXTS)]
    qs = ["what is the capital of hawaii", "where is the eiffel tower", "which mountain is the highest on earth"]
    return [Group(question=q, passages=[ctx[(i + j) % len(ctx)] for j in range(4)],
                  positive=[True, False, False, False], ignore=[False, False, j == 1, False])
            for i, (q, j) in enumerate(zip(qs, range(3)))]


def _logits_and_grads(model, inputs, positive, ignore, micro):
    model.zero_grad(set_to_none=True)
    logits = forward_logits(model, inputs, contextlib.nullcontext(), micro)
    loss = LOSSES["listwise"](logits.view(positive.shape), positive, ignore)
    loss.backward()
    return logits.detach(), loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("micro", [1, 2, 5, 8])
def test_chunked_forward_equals_one_forward(tiny_model_dir, micro):
    torch.manual_seed(0)
    model, tok = build_cross_encoder(str(tiny_model_dir))
    model.eval()  # no dropout: the chunks must give the very same function, not the same distribution
    groups = _groups()
    batch = collate(groups, tok, 64, True)
    lengths = batch["attention_mask"].sum(1)
    assert len(set(lengths.tolist())) > 2  # the case needs rows of different lengths (padding to trim)
    inputs = {k: v for k, v in batch.items() if k not in ("positive", "ignore")}
    one = _logits_and_grads(model, inputs, batch["positive"], batch["ignore"], 0)
    many = _logits_and_grads(model, inputs, batch["positive"], batch["ignore"], micro)
    torch.testing.assert_close(many[0], one[0], rtol=1e-5, atol=1e-5)  # row i is still pair i
    assert abs(many[1] - one[1]) < 1e-5
    assert one[2].keys() == many[2].keys()
    for name in one[2]:
        torch.testing.assert_close(many[2][name], one[2][name], rtol=1e-4, atol=1e-6, msg=name)


def test_length_bucket_size_is_checked_and_left_out_of_old_fingerprints():
    with pytest.raises(ValueError, match="length_bucket_size"):
        RerankConfig.from_dict({"train": {"length_bucket_size": -1}})
    # 0 (one forward, an earlier default): left out, so the runs recorded with it keep their fingerprints
    assert "length_bucket_size" not in RerankConfig.from_dict({"train": {"length_bucket_size": 0}}).as_dict()["train"]
    assert RerankConfig().as_dict()["train"]["length_bucket_size"] == 8
