"""The Matryoshka loss equals a hand computation on a small case; encode-time truncation re-normalises."""

from __future__ import annotations

import math

import pytest
import torch

from dpr.losses import PairMasks, SoftmaxNLLLoss
from dpr.losses.matryoshka import MatryoshkaLoss, truncate


def _cosine(q, p):
    return (torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(p, dim=-1).T) / 0.5


def _nll(scores, positive):
    return sum(math.log(sum(math.exp(s) for s in row)) - row[j] for row, j in zip(scores, positive)) / len(scores)


def test_matryoshka_loss_equals_a_hand_computation():
    q = torch.tensor([[1.0, 0.0, 1.0, 2.0], [0.0, 1.0, -1.0, 0.5]], dtype=torch.float64)
    p = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 2.0, 1.0, 0.0], [1.0, -1.0, 2.0, 0.0]], dtype=torch.float64)
    masks = PairMasks(torch.tensor([[True, False, False], [False, True, False]]), torch.zeros(2, 3, dtype=torch.bool))
    loss = MatryoshkaLoss(SoftmaxNLLLoss(), dims=[4, 2], weights=[1.0, 0.5])
    got = loss(q, p, masks, _cosine, gather=False).loss.item()

    def hand(d):  # cosine of the d-prefixes (each re-normalised) / temperature 0.5, softmax NLL by hand
        rows = []
        for qi in q.tolist():
            rows.append([])
            for pj in p.tolist():
                a, b = qi[:d], pj[:d]
                cos = sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
                rows[-1].append(cos / 0.5)
        return _nll(rows, [0, 1])

    # 1e-6: the losses score in float32 (dpr.losses.base.score_pool)
    assert got == pytest.approx(hand(4) + 0.5 * hand(2), abs=1e-6)
    # one dimension, the full one: the inner loss itself
    single = MatryoshkaLoss(SoftmaxNLLLoss(), dims=[4])(q, p, masks, _cosine, gather=False).loss.item()
    assert single == pytest.approx(SoftmaxNLLLoss()(q, p, masks, _cosine, gather=False).loss.item(), abs=1e-6)


def test_bad_dims_and_weights_are_one_line_errors():
    with pytest.raises(ValueError, match="matryoshka_dims"):
        MatryoshkaLoss(SoftmaxNLLLoss(), dims=[4, 4])
    with pytest.raises(ValueError, match="matryoshka_weights"):
        MatryoshkaLoss(SoftmaxNLLLoss(), dims=[4, 2], weights=[1.0])
    q = torch.ones(1, 4)
    with pytest.raises(ValueError, match="4 dimensions"):
        MatryoshkaLoss(SoftmaxNLLLoss(), dims=[8])(q, q, PairMasks.dpr_layout(1, 1), _cosine, gather=False)


def test_truncate_renormalises_cosine_vectors_only():
    v = torch.tensor([[3.0, 4.0, 12.0]])
    assert torch.allclose(truncate(v, 2, normalize=True), torch.tensor([[0.6, 0.8]]))
    assert torch.equal(truncate(v, 2, normalize=False), torch.tensor([[3.0, 4.0]]))
    assert truncate(v, None, True) is v and truncate(v, 3, True) is v


def test_train_config_checks_the_sizes_in_one_line():
    from dpr.training.config import TrainConfig

    assert TrainConfig.from_dict({"matryoshka_dims": [384, 96], "matryoshka_weights": [1, 0.5]}).matryoshka_dims == [
        384, 96]
    for bad, match in (({"matryoshka_dims": [96, 96]}, "distinct"), ({"matryoshka_dims": [0]}, "matryoshka_dims"),
                       ({"matryoshka_weights": [1.0]}, "needs train.matryoshka_dims"),
                       ({"matryoshka_dims": [8, 4], "matryoshka_weights": [1.0]}, "matryoshka_weights")):
        with pytest.raises(ValueError, match=match):
            TrainConfig.from_dict(bad)
