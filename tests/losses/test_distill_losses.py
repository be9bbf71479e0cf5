"""The distillation losses (kl_distill, margin_mse) against hand computations, and their invariances.

(2-process, gradient-cache and kill/resume equalities: test_distributed, test_grad_cache, test_resume_losses.)
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from dpr.losses import KLDistillLoss, MarginMSELoss, PairMasks, build_loss

NAN = float("nan")
# B=2 questions, 5 candidates: q0's positive is 0, q1's is 3 (q1 also has a second positive, 4).
Q = [[1.0, 0.0], [0.0, 1.0]]
P = [[1.0, 0.2], [2.0, 0.5], [0.5, 2.0], [0.3, 1.5], [-1.0, 1.0]]
POS = [[0], [3, 4]]
IGN = [[2], [0]]  # one false negative each
# q0: candidate 4 unscored; q1: candidate 1 unscored (the ignored ones are scored but must not count)
TEACHER = [[4.0, 1.0, 9.0, 0.5, NAN], [7.0, NAN, 2.0, 5.0, 3.5]]


def dot(q, p):
    return q @ p.T


def hand_scores():
    return [[sum(a * b for a, b in zip(q, p)) for p in P] for q in Q]


def masks(teacher=TEACHER) -> PairMasks:
    positive = torch.zeros(2, 5, dtype=torch.bool)
    ignore = torch.zeros(2, 5, dtype=torch.bool)
    for i in range(2):
        positive[i, POS[i]] = True
        ignore[i, IGN[i]] = True
    return PairMasks(positive, ignore, torch.tensor(teacher))


def usable(i):
    """Candidates of question i in both distributions: scored and not ignored."""
    return [j for j in range(5) if not math.isnan(TEACHER[i][j]) and j not in IGN[i]]


def softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


def hand_kl(i, scores, tau_t, tau_s):
    cols = usable(i)
    t = softmax([TEACHER[i][j] / tau_t for j in cols])
    s = softmax([scores[i][j] / tau_s for j in cols])
    return sum(a * (math.log(a) - math.log(b)) for a, b in zip(t, s))


def hand_nll(i, scores):
    num = sum(math.exp(scores[i][j]) for j in POS[i])
    den = sum(math.exp(scores[i][j]) for j in range(5) if j not in IGN[i])
    return -math.log(num / den)


def hand_margin_mse(i, scores, scale):
    cols = usable(i)
    pos = [j for j in cols if j in POS[i]]
    neg = [k for k in cols if k not in POS[i]]
    errs = [((scores[i][j] - scores[i][k]) - scale * (TEACHER[i][j] - TEACHER[i][k])) ** 2 for j in pos for k in neg]
    return sum(errs) / len(errs)


@pytest.mark.parametrize("tau_t,tau_s,nll_weight", [(1.0, 1.0, 0.0), (2.0, 0.5, 0.0), (0.7, 1.3, 0.4)])
def test_kl_distill_matches_hand_computation(tau_t, tau_s, nll_weight):
    scores = hand_scores()
    kl_weight = 0.8
    expected = sum(kl_weight * hand_kl(i, scores, tau_t, tau_s) + nll_weight * hand_nll(i, scores)
                   for i in range(2)) / 2
    loss = KLDistillLoss(kl_weight=kl_weight, nll_weight=nll_weight, teacher_temperature=tau_t,
                         student_temperature=tau_s)
    out = loss(torch.tensor(Q), torch.tensor(P), masks(), dot)
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)
    assert out.num_candidates == 5 and out.masked == 2


@pytest.mark.parametrize("scale,nll_weight", [(1.0, 0.0), (0.25, 0.0), (2.0, 0.3)])
def test_margin_mse_matches_hand_computation(scale, nll_weight):
    scores = hand_scores()
    expected = sum(hand_margin_mse(i, scores, scale) + nll_weight * hand_nll(i, scores) for i in range(2)) / 2
    out = MarginMSELoss(teacher_scale=scale, nll_weight=nll_weight)(torch.tensor(Q), torch.tensor(P), masks(), dot)
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("make", [lambda: KLDistillLoss(teacher_temperature=1.5), lambda: MarginMSELoss(0.5)],
                         ids=["kl_distill", "margin_mse"])
def test_ignored_and_unscored_pairs_leave_the_loss(make):
    """Moving an ignored or unscored candidate's vector, or changing an ignored pair's teacher score,
    changes nothing; moving a scored one does."""
    loss = make()
    base = loss(torch.tensor(Q), torch.tensor(P), masks(), dot).loss.item()
    teacher = [row[:] for row in TEACHER]
    teacher[0][2] = -50.0  # ignored for q0
    teacher[1][0] = 40.0   # ignored for q1
    assert loss(torch.tensor(Q), torch.tensor(P), masks(teacher), dot).loss.item() == pytest.approx(base, rel=1e-6)
    # q0 = (1, 0) and q1 = (0, 1): moving a candidate along the first axis changes q0's scores only.
    # Candidate 2 is ignored for q0, candidate 4 unscored for q0: nothing moves. Candidate 1 is scored for q0.
    for j in (2, 4):
        moved = torch.tensor(P)
        moved[j, 0] += 3.0
        assert loss(torch.tensor(Q), moved, masks(), dot).loss.item() == pytest.approx(base, rel=1e-6), j
    moved = torch.tensor(P)
    moved[1, 0] += 3.0
    assert loss(torch.tensor(Q), moved, masks(), dot).loss.item() != pytest.approx(base, rel=1e-6)


def test_margin_mse_is_unchanged_when_the_teacher_scores_shift_by_a_constant():
    base = MarginMSELoss()(torch.tensor(Q), torch.tensor(P), masks(), dot).loss.item()
    for shift in (-7.5, 3.0, 100.0):
        shifted = [[v + shift for v in row] for row in TEACHER]
        got = MarginMSELoss()(torch.tensor(Q), torch.tensor(P), masks(shifted), dot).loss.item()
        assert got == pytest.approx(base, rel=1e-5, abs=1e-6)
    # and a per-question shift too (the margins are within one question)
    rows = [[v + 5.0 for v in TEACHER[0]], [v - 2.0 for v in TEACHER[1]]]
    assert MarginMSELoss()(torch.tensor(Q), torch.tensor(P), masks(rows), dot).loss.item() == pytest.approx(base)
    # control: scaling the teacher does change it
    scaled = [[v * 2 for v in row] for row in TEACHER]
    assert MarginMSELoss()(torch.tensor(Q), torch.tensor(P), masks(scaled), dot).loss.item() != pytest.approx(base)


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_kl_with_the_students_own_scores_as_teacher_has_zero_loss_and_gradient(tau):
    torch.manual_seed(0)
    q = torch.randn(3, 4, requires_grad=True)
    p = torch.randn(6, 4, requires_grad=True)
    m = PairMasks.dpr_layout(3, 2)
    m.ignore[0, 3] = True
    student = (q @ p.T).detach().clone()
    student[1, 5] = NAN  # an unscored pair too
    m.teacher = student
    loss = KLDistillLoss(teacher_temperature=tau, student_temperature=tau)
    out = loss(q, p, m, dot)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.0, abs=1e-6)
    assert q.grad.abs().max().item() < 1e-6 and p.grad.abs().max().item() < 1e-6
    # control: another teacher gives a gradient
    q.grad = p.grad = None
    m.teacher = torch.nan_to_num(student, nan=0.0).flip(1)
    loss(q, p, m, dot).loss.backward()
    assert q.grad.abs().max().item() > 1e-3


def test_questions_without_scored_pairs_contribute_zero():
    teacher = [[NAN] * 5, TEACHER[1]]
    scores = hand_scores()
    out = KLDistillLoss()(torch.tensor(Q), torch.tensor(P), masks(teacher), dot)
    assert out.loss.item() == pytest.approx(hand_kl(1, scores, 1.0, 1.0) / 2, rel=1e-5)
    out = MarginMSELoss()(torch.tensor(Q), torch.tensor(P), masks(teacher), dot)
    assert math.isfinite(out.loss.item())
    assert out.loss.item() == pytest.approx(hand_margin_mse(1, scores, 1.0) / 2, rel=1e-5)


@pytest.mark.parametrize("cls", [KLDistillLoss, MarginMSELoss])
def test_missing_teacher_scores_are_one_clear_error(cls):
    m = masks()
    m.teacher = None
    with pytest.raises(ValueError, match="teacher_scores"):
        cls()(torch.tensor(Q), torch.tensor(P), m, dot)


@pytest.mark.parametrize("kwargs,key", [({"kl_weight": -1}, "kl_weight"),
                                        ({"teacher_temperature": 0}, "teacher_temperature"),
                                        ({"student_temperature": -1}, "student_temperature"),
                                        ({"nll_weight": -0.1}, "nll_weight")])
def test_kl_distill_refuses_bad_settings(kwargs, key):
    with pytest.raises(ValueError, match=key):
        KLDistillLoss(**kwargs)


def test_margin_mse_refuses_bad_settings():
    with pytest.raises(ValueError, match="teacher_scale"):
        MarginMSELoss(teacher_scale=0)
    with pytest.raises(ValueError, match="nll_weight"):
        MarginMSELoss(nll_weight=-1)


@pytest.mark.parametrize("name,cls", [("kl_distill", KLDistillLoss), ("margin_mse", MarginMSELoss)])
def test_yaml_builds_the_loss_with_its_defaults_and_declares_the_scores_teacher(name, cls):
    cfg = yaml.safe_load((Path(__file__).resolve().parents[2] / "conf" / "loss" / f"{name}.yaml").read_text())
    loss = build_loss(cfg)
    assert isinstance(loss, cls) and loss.teacher == "scores"
    assert vars(loss) == vars(cls())  # the YAML only selects: its values are the dataclass' defaults
