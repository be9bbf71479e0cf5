"""Every loss of dpr.losses against hand computations: one and several positives, masked pairs, shapes.

(The 2-process equality is in test_distributed; masks built from batches are in test_masks.)
"""

from __future__ import annotations

import math

import pytest
import torch

from dpr.losses import HingeLoss, LossOutput, PairMasks, SoftmaxNLLLoss, build_loss


def dot(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return q @ p.T


# B=2 questions, H=1 hard negative each: p = [pos_0, hn_0, pos_1, hn_1].
Q = [[1.0, 0.0], [0.0, 1.0]]
P = [[1.0, 0.0], [2.0, 0.5], [0.5, 2.0], [0.0, 1.0]]


def hand_scores() -> list[list[float]]:
    return [[sum(a * b for a, b in zip(q, p)) for p in P] for q in Q]


def hand_nll(row: list[float], positives: set[int], ignored: set[int] = frozenset()) -> float:
    """-log( sum_pos exp / sum_{not ignored} exp ), written out."""
    num = sum(math.exp(s) for j, s in enumerate(row) if j in positives)
    den = sum(math.exp(s) for j, s in enumerate(row) if j not in ignored)
    return -math.log(num / den)


def masks(pos: list[list[int]], ign: list[list[int]] = ((), ())) -> PairMasks:
    positive = torch.zeros(2, 4, dtype=torch.bool)
    ignore = torch.zeros(2, 4, dtype=torch.bool)
    for i, cols in enumerate(pos):
        positive[i, list(cols)] = True
    for i, cols in enumerate(ign):
        ignore[i, list(cols)] = True
    return PairMasks(positive, ignore)


DPR = PairMasks.dpr_layout(2, 2)


def test_dpr_layout_is_the_diagonal_of_blocks():
    assert DPR.positive.tolist() == [[True, False, False, False], [False, False, True, False]]
    assert not DPR.ignore.any()


def test_softmax_nll_matches_hand_computation():
    scores = hand_scores()  # q0: [1, 2, .5, 0]   q1: [0, .5, 2, 1]
    expected = (hand_nll(scores[0], {0}) + hand_nll(scores[1], {2})) / 2
    out = SoftmaxNLLLoss()(torch.tensor(Q), torch.tensor(P), DPR, dot)
    assert isinstance(out, LossOutput)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    # q0's hard negative outscores its positive (rank 1); q1's positive is on top (rank 0).
    assert out.accuracy == pytest.approx(0.5) and out.avg_rank == pytest.approx(0.5)
    assert out.num_candidates == 4 and out.masked == 0


def test_softmax_nll_with_several_positives_and_masked_pairs():
    scores = hand_scores()
    # q0: positives 0 and 3, candidate 1 masked (a false negative); q1: positive 2, candidate 0 masked
    m = masks([[0, 3], [2]], [[1], [0]])
    expected = (hand_nll(scores[0], {0, 3}, {1}) + hand_nll(scores[1], {2}, {0})) / 2
    out = SoftmaxNLLLoss()(torch.tensor(Q), torch.tensor(P), m, dot)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.masked == 2
    # with candidate 1 masked, q0's best positive (score 1) is on top
    assert out.accuracy == 1.0 and out.avg_rank == 0.0


def test_masking_removes_exactly_the_flagged_pairs():
    """A masked candidate's score has no effect on the loss or its gradient; an unmasked one does."""
    q = torch.tensor(Q)
    m = masks([[0], [2]], [[1], []])
    base = SoftmaxNLLLoss()(q, torch.tensor(P), m, dot).loss.item()
    moved = [row[:] for row in P]
    moved[1] = [9.0, 9.0]  # candidate 1: ignored for q0, a negative for q1
    out = SoftmaxNLLLoss()(q, torch.tensor(moved), m, dot).loss.item()
    scores = [[sum(a * b for a, b in zip(qq, p)) for p in moved] for qq in Q]
    assert out == pytest.approx((hand_nll(scores[0], {0}, {1}) + hand_nll(scores[1], {2})) / 2, rel=1e-6)
    assert out != pytest.approx(base)  # q1 sees the moved candidate ...
    only_q0 = PairMasks(m.positive[:1], m.ignore[:1])
    a = SoftmaxNLLLoss()(q[:1], torch.tensor(P), only_q0, dot).loss.item()
    b = SoftmaxNLLLoss()(q[:1], torch.tensor(moved), only_q0, dot).loss.item()
    assert a == pytest.approx(b, rel=1e-7)  # ... q0 does not


def test_temperature_scales_scores():
    t = 0.5
    scores = [[s / t for s in row] for row in hand_scores()]
    expected = (hand_nll(scores[0], {0}) + hand_nll(scores[1], {2})) / 2
    out = SoftmaxNLLLoss()(torch.tensor(Q), torch.tensor(P), DPR, lambda q, p: dot(q, p) / t)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)


def test_gradient_matches_softmax_formula():
    # dL/dq_i = (1/B) * sum_j (softmax_ij - [j == target_i]) * p_j
    q = torch.tensor(Q, requires_grad=True)
    SoftmaxNLLLoss()(q, torch.tensor(P), DPR, dot).loss.backward()
    scores = hand_scores()
    for i, target in ((0, 0), (1, 2)):
        z = sum(math.exp(s) for s in scores[i])
        coef = [math.exp(s) / z - (1.0 if j == target else 0.0) for j, s in enumerate(scores[i])]
        expected = [sum(c * P[j][d] for j, c in enumerate(coef)) / 2 for d in range(2)]
        assert q.grad[i].tolist() == pytest.approx(expected, rel=1e-5)


def test_hinge_matches_hand_computation():
    scores = hand_scores()
    m = masks([[0, 3], [2]], [[1], [0]])
    margin = 1.0

    def row_loss(row, pos, ign):
        best = max(row[j] for j in pos)
        negs = [j for j in range(4) if j not in pos and j not in ign]
        return sum(max(0.0, margin - best + row[j]) for j in negs) / len(negs)

    expected = (row_loss(scores[0], {0, 3}, {1}) + row_loss(scores[1], {2}, {0})) / 2
    out = HingeLoss(margin)(torch.tensor(Q), torch.tensor(P), m, dot)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.masked == 2


def test_gather_without_process_group_is_local():
    q, p = torch.randn(3, 4), torch.randn(9, 4)
    m = PairMasks.dpr_layout(3, 3)
    a = SoftmaxNLLLoss()(q, p, m, dot, gather=True)
    b = SoftmaxNLLLoss()(q, p, m, dot, gather=False)
    assert a.loss.item() == b.loss.item() and a.num_candidates == 9


@pytest.mark.parametrize("q_shape,p_shape", [((2, 2), (3, 2)), ((2, 2), (4, 3)), ((2,), (4, 2))])
def test_bad_shapes_are_rejected(q_shape, p_shape):
    with pytest.raises(ValueError):
        SoftmaxNLLLoss()(torch.zeros(q_shape), torch.zeros(p_shape), DPR, dot)


def test_inconsistent_masks_are_rejected():
    both = masks([[0], [2]], [[0], []])
    with pytest.raises(ValueError, match="both positive and ignored"):
        SoftmaxNLLLoss()(torch.tensor(Q), torch.tensor(P), both, dot)
    none = masks([[0], []])
    with pytest.raises(ValueError, match="at least one positive"):
        SoftmaxNLLLoss()(torch.tensor(Q), torch.tensor(P), none, dot)


def test_build_loss_from_config():
    assert isinstance(build_loss(None), SoftmaxNLLLoss)
    h = build_loss({"_target_": "dpr.losses.HingeLoss", "margin": 0.5})
    assert isinstance(h, HingeLoss) and h.margin == 0.5
    with pytest.raises(ValueError, match="HingeLoss"):
        build_loss({"_target_": "dpr.losses.HingeLoss", "margni": 0.5})


def test_lexical_distill_matches_hand_computation():
    from dpr.losses import LexicalDistillLoss

    scores = hand_scores()
    teacher = [[3.0, 1.0, 0.0, 2.0], [0.5, 0.0, 4.0, 1.0]]
    m = masks([[0], [2]], [[1], []])
    m.teacher = torch.tensor(teacher)
    alpha, tau = 0.7, 2.0

    def kl(t_row, s_row, ign):
        keep = [j for j in range(4) if j not in ign]
        zt = sum(math.exp(t_row[j] / tau) for j in keep)
        zs = sum(math.exp(s_row[j]) for j in keep)
        return sum(math.exp(t_row[j] / tau) / zt * (t_row[j] / tau - math.log(zt) - (s_row[j] - math.log(zs)))
                   for j in keep)

    expected = ((hand_nll(scores[0], {0}, {1}) + alpha * kl(teacher[0], scores[0], {1}))
                + (hand_nll(scores[1], {2}) + alpha * kl(teacher[1], scores[1], set()))) / 2
    out = LexicalDistillLoss(alpha, tau)(torch.tensor(Q), torch.tensor(P), m, dot)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    # alpha = 0 is the softmax NLL
    plain = SoftmaxNLLLoss()(torch.tensor(Q), torch.tensor(P), m, dot).loss.item()
    assert LexicalDistillLoss(0.0)(torch.tensor(Q), torch.tensor(P), m, dot).loss.item() == pytest.approx(plain)
    with pytest.raises(ValueError, match="teacher"):
        LexicalDistillLoss()(torch.tensor(Q), torch.tensor(P), masks([[0], [2]]), dot)


def column(scores: list[list[float]], j: int) -> list[float]:
    return [row[j] for row in scores]


def test_symmetric_nll_matches_hand_computation():
    from dpr.losses import SymmetricSoftmaxNLLLoss

    scores = hand_scores()
    # q0: positives 0 and 3, candidate 1 masked; q1: positive 2, candidate 0 masked.
    # Reverse: column 0 is q0's (q1 ignores it: q1 leaves its denominator), column 3 q0's, column 2 q1's.
    m = masks([[0, 3], [2]], [[1], [0]])
    rev = {0: hand_nll(column(scores, 0), {0}, {1}), 3: hand_nll(column(scores, 3), {0}),
           2: hand_nll(column(scores, 2), {1})}
    w = 0.5
    expected = (hand_nll(scores[0], {0, 3}, {1}) + w * (rev[0] + rev[3]) / 2
                + hand_nll(scores[1], {2}, {0}) + w * rev[2]) / 2
    out = SymmetricSoftmaxNLLLoss(w)(torch.tensor(Q), torch.tensor(P), m, dot)
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    assert out.masked == 2 and out.accuracy == 1.0
    # weight 0, or candidates that are not the batch's passages (gather=False): the forward NLL alone
    plain = SoftmaxNLLLoss()(torch.tensor(Q), torch.tensor(P), m, dot).loss.item()
    assert SymmetricSoftmaxNLLLoss(0.0)(torch.tensor(Q), torch.tensor(P), m, dot).loss.item() == pytest.approx(plain)
    assert SymmetricSoftmaxNLLLoss(w)(torch.tensor(Q), torch.tensor(P), m, dot, gather=False).loss.item() == \
        pytest.approx(plain)
    with pytest.raises(ValueError, match="passage_weight"):
        SymmetricSoftmaxNLLLoss(-1.0)


def test_symmetric_nll_reaches_the_questions_through_the_reverse_term():
    """Gradients differ from the forward NLL's only through the reverse term (a negative control: with
    weight 0 they are equal)."""
    from dpr.losses import SymmetricSoftmaxNLLLoss

    def q_grad(loss):
        q = torch.tensor(Q, requires_grad=True)
        loss(q, torch.tensor(P), masks([[0], [2]]), dot).loss.backward()
        return q.grad

    plain = q_grad(SoftmaxNLLLoss())
    assert torch.allclose(q_grad(SymmetricSoftmaxNLLLoss(0.0)), plain)
    assert not torch.allclose(q_grad(SymmetricSoftmaxNLLLoss(1.0)), plain)
