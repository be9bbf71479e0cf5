"""The contrastive loss against hand computations (single process; the 2-process case is in test_distributed)."""

from __future__ import annotations

import math

import pytest
import torch

from dpr.loss import LossOutput, contrastive_loss


def dot(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return q @ p.T


# B=2 questions, H=1 hard negative each: p = [pos_0, hn_0, pos_1, hn_1].
Q = [[1.0, 0.0], [0.0, 1.0]]
P = [[1.0, 0.0], [2.0, 0.5], [0.5, 2.0], [0.0, 1.0]]


def hand_scores() -> list[list[float]]:
    return [[sum(a * b for a, b in zip(q, p)) for p in P] for q in Q]


def hand_ce(row: list[float], target: int) -> float:
    return -(row[target] - math.log(sum(math.exp(s) for s in row)))


def test_loss_matches_hand_computation():
    scores = hand_scores()  # q0: [1, 2, .5, 0]   q1: [0, .5, 2, 1]
    expected = (hand_ce(scores[0], 0) + hand_ce(scores[1], 2)) / 2
    out = contrastive_loss(torch.tensor(Q), torch.tensor(P), dot, 2)
    assert isinstance(out, LossOutput)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    # q0's hard negative outscores its positive (rank 1); q1's positive is on top (rank 0).
    assert out.accuracy == pytest.approx(0.5)
    assert out.avg_rank == pytest.approx(0.5)
    assert out.num_candidates == 4
    assert isinstance(out.accuracy, float) and isinstance(out.avg_rank, float)


def test_temperature_scales_scores():
    t = 0.5
    scores = [[s / t for s in row] for row in hand_scores()]
    expected = (hand_ce(scores[0], 0) + hand_ce(scores[1], 2)) / 2
    out = contrastive_loss(torch.tensor(Q), torch.tensor(P), lambda q, p: dot(q, p) / t, 2)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)


def test_gradient_matches_softmax_formula():
    # dL/dq_i = (1/B) * sum_j (softmax_ij - [j == target_i]) * p_j
    q = torch.tensor(Q, requires_grad=True)
    p = torch.tensor(P, requires_grad=True)
    contrastive_loss(q, p, dot, 2).loss.backward()
    scores = hand_scores()
    for i, target in ((0, 0), (1, 2)):
        z = sum(math.exp(s) for s in scores[i])
        coef = [math.exp(s) / z - (1.0 if j == target else 0.0) for j, s in enumerate(scores[i])]
        expected = [sum(c * P[j][d] for j, c in enumerate(coef)) / 2 for d in range(2)]
        assert q.grad[i].tolist() == pytest.approx(expected, rel=1e-5)


def test_no_hard_negatives_is_in_batch_only():
    q = torch.tensor(Q)
    p = torch.tensor([P[0], P[2]])  # positives only: targets 0 and 1
    scores = [[1.0, 0.5], [0.0, 2.0]]
    expected = (hand_ce(scores[0], 0) + hand_ce(scores[1], 1)) / 2
    out = contrastive_loss(q, p, dot, 1)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.accuracy == 1.0 and out.avg_rank == 0.0


def test_gather_without_process_group_is_local():
    q, p = torch.randn(3, 4), torch.randn(9, 4)
    a = contrastive_loss(q, p, dot, 3, gather=True)
    b = contrastive_loss(q, p, dot, 3, gather=False)
    assert a.loss.item() == b.loss.item() and a.num_candidates == 9


def test_architecture_keyword_aliases():
    q, p = torch.tensor(Q), torch.tensor(P)
    a = contrastive_loss(q, p, similarity_fn=dot, num_passages_per_question=2)
    b = contrastive_loss(q, p, dot, 2)
    assert a.loss.item() == b.loss.item()


@pytest.mark.parametrize(
    "q_shape,p_shape,per_q",
    [((2, 2), (3, 2), 2), ((2, 2), (4, 3), 2), ((2, 2), (4, 2), 0), ((2,), (4, 2), 2)],
)
def test_bad_shapes_are_rejected(q_shape, p_shape, per_q):
    with pytest.raises(ValueError):
        contrastive_loss(torch.zeros(q_shape), torch.zeros(p_shape), dot, per_q)


def test_missing_similarity_is_an_error():
    with pytest.raises(TypeError):
        contrastive_loss(torch.zeros(2, 2), torch.zeros(4, 2), passages_per_question=2)
