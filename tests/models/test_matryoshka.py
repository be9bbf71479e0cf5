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


def _cos_rows(q, p, d):  # cosine of the d-prefixes / temperature 0.5, by hand
    out = []
    for qi in q.tolist():
        a = qi[:d]
        out.append([sum(x * y for x, y in zip(a, pj[:d]))
                    / math.sqrt(sum(x * x for x in a) * sum(y * y for y in pj[:d])) / 0.5 for pj in p.tolist()])
    return out


def test_self_distillation_adds_the_kl_to_the_largest_size_by_hand_and_never_pulls_the_teacher():
    q = torch.tensor([[1.0, 0.0, 1.0, 2.0], [0.0, 1.0, -1.0, 0.5]], dtype=torch.float64, requires_grad=True)
    p = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 2.0, 1.0, 0.0], [1.0, -1.0, 2.0, 0.0]], dtype=torch.float64)
    # question 1's third candidate is ignored: out of both softmaxes
    masks = PairMasks(torch.tensor([[True, False, False], [False, True, False]]),
                      torch.tensor([[False, False, False], [False, False, True]]))
    plain = MatryoshkaLoss(SoftmaxNLLLoss(), dims=[4, 3, 2])(q, p, masks, _cosine, gather=False).loss
    out = MatryoshkaLoss(SoftmaxNLLLoss(), dims=[4, 3, 2], distill=0.3)(q, p, masks, _cosine, gather=False).loss

    def softmax(row):
        z = sum(math.exp(s) for s in row)
        return [math.exp(s) / z for s in row]

    def kl(d):
        teacher, student = _cos_rows(q.detach(), p, 4), _cos_rows(q.detach(), p, d)
        total = 0.0
        for i, (t, s) in enumerate(zip(teacher, student)):
            keep = [j for j in range(3) if not masks.ignore[i, j]]
            pt, ps = softmax([t[j] for j in keep]), softmax([s[j] for j in keep])
            total += sum(a * math.log(a / b) for a, b in zip(pt, ps))
        return total / 2

    assert kl(3) > 1e-3 and kl(2) > 1e-3  # the case is not degenerate
    assert (out - plain).item() == pytest.approx(0.3 * (kl(3) + kl(2)), abs=1e-6)
    # the teacher is detached: the distillation term's gradient never reaches coordinates only the largest size
    # scores (the 4th here), and at the coordinates the students use it is not zero
    (grad,) = torch.autograd.grad(out - plain, q)
    assert torch.count_nonzero(grad[:, 3:]) == 0 and torch.count_nonzero(grad[:, :3]) > 0


def test_the_wrapped_loss_gets_the_callers_gather_flag():
    """symmetric_nll adds its reverse (passage -> question) term only for the in-batch pool (``gather=True``): a
    Matryoshka wrapper that handed it a pre-gathered pool with ``gather=False`` would silently drop that term."""
    from dpr.losses import SymmetricSoftmaxNLLLoss

    g = torch.Generator().manual_seed(0)
    q, p = torch.randn(3, 8, generator=g), torch.randn(6, 8, generator=g)
    masks = PairMasks.dpr_layout(3, 2)
    inner = SymmetricSoftmaxNLLLoss(passage_weight=1.0)
    for gather in (True, False):
        wrapped = MatryoshkaLoss(inner, dims=[8], distill=None)(q, p, masks, _cosine, gather=gather).loss
        assert wrapped.item() == pytest.approx(inner(q, p, masks, _cosine, gather=gather).loss.item(), abs=1e-6)
    assert inner(q, p, masks, _cosine, gather=True).loss.item() != pytest.approx(
        inner(q, p, masks, _cosine, gather=False).loss.item(), abs=1e-3)  # the flag matters for this loss


def test_bad_dims_and_weights_are_one_line_errors():
    with pytest.raises(ValueError, match="matryoshka_dims"):
        MatryoshkaLoss(SoftmaxNLLLoss(), dims=[4, 4])
    with pytest.raises(ValueError, match="matryoshka_weights"):
        MatryoshkaLoss(SoftmaxNLLLoss(), dims=[4, 2], weights=[1.0])
    with pytest.raises(ValueError, match="matryoshka_distill must be a non-negative"):
        MatryoshkaLoss(SoftmaxNLLLoss(), dims=[4, 2], distill=-1.0)
    with pytest.raises(ValueError, match="at least two"):
        MatryoshkaLoss(SoftmaxNLLLoss(), dims=[4], distill=1.0)
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
                       ({"matryoshka_distill": 0.5}, "needs train.matryoshka_dims"),
                       ({"matryoshka_dims": [8, 4], "matryoshka_weights": [1.0]}, "matryoshka_weights")):
        with pytest.raises(ValueError, match=match):
            TrainConfig.from_dict(bad)
