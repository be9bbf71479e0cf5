"""Listwise distillation from a teacher's scores (a cross-encoder's): KL between the two softmaxes.

For question ``i`` let ``S_i`` be the candidates the teacher scored that are not ignored (``masks.teacher``
not NaN, ``masks.ignore`` off: :func:`dpr.losses.base.teacher_scored`). Then::

    KL_i   = sum_{j in S_i} T_ij (log T_ij - log Q_ij)
    T_i    = softmax_{S_i}(t_i / teacher_temperature)      Q_i = softmax_{S_i}(s_i / student_temperature)
    loss_i = kl_weight * KL_i + nll_weight * NLL_i

``t`` are the teacher's scores, ``s`` the model's (already divided by the model's own similarity
temperature); NLL is :mod:`dpr.losses.softmax_nll` over the whole pool (unscored in-batch negatives
keep their place there). Both distributions live on ``S_i`` only: a masked or unscored pair leaves both,
so the student is never pulled towards a teacher's silence. A question with fewer than two scored pairs
has no ranking to learn (KL_i = 0). The mean runs over all of this rank's questions (as every loss's
does), so the DDP objective equals one process holding the global batch. No ``tau**2`` factor: the
weight is ``kl_weight``.
"""

from __future__ import annotations

import torch

from dpr.losses.base import LossOutput, PairMasks, Similarity, loss_output, score_pool, teacher_scored
from dpr.losses.softmax_nll import masked_softmax_nll


class KLDistillLoss:
    name = "kl_distill"
    teacher = "scores"  # the trainer puts the teacher-scores file's scores in masks.teacher

    def __init__(self, kl_weight: float = 1.0, nll_weight: float = 0.0, teacher_temperature: float = 1.0,
                 student_temperature: float = 1.0) -> None:
        for key, value in (("kl_weight", kl_weight), ("nll_weight", nll_weight)):
            if not value >= 0:
                raise ValueError(f"loss.{key} must be >= 0, got {value}")
        for key, value in (("teacher_temperature", teacher_temperature), ("student_temperature", student_temperature)):
            if not value > 0:
                raise ValueError(f"loss.{key} must be > 0, got {value}")
        self.kl_weight, self.nll_weight = float(kl_weight), float(nll_weight)
        self.teacher_temperature, self.student_temperature = float(teacher_temperature), float(student_temperature)

    def __call__(self, q: torch.Tensor, p: torch.Tensor, masks: PairMasks, similarity: Similarity,
                 gather: bool = True) -> LossOutput:
        scores, masks = score_pool(q, p, masks, similarity, gather)
        kl = listwise_kl(scores, masks, self.teacher_temperature, self.student_temperature, self.name)
        loss = self.kl_weight * kl
        if self.nll_weight:
            loss = loss + self.nll_weight * masked_softmax_nll(scores, masks)
        return loss_output(loss.mean(), scores, masks)


def listwise_kl(scores: torch.Tensor, masks: PairMasks, teacher_temperature: float = 1.0,
                student_temperature: float = 1.0, name: str = "kl_distill") -> torch.Tensor:
    """Per-question ``KL(teacher || student)`` over the scored, non-ignored pairs (0 with fewer than two)."""
    scored = teacher_scored(masks, name)
    neg_inf = torch.finfo(scores.dtype).min
    # NaN teacher scores are replaced before the softmax: masked_fill keeps them out of every sum
    teacher = torch.nan_to_num(masks.teacher.to(scores), nan=0.0) / teacher_temperature
    log_t = torch.log_softmax(teacher.masked_fill(~scored, neg_inf), dim=1)
    log_s = torch.log_softmax((scores / student_temperature).masked_fill(~scored, neg_inf), dim=1)
    kl = (log_t.exp() * (log_t - log_s)).masked_fill(~scored, 0.0).sum(dim=1)
    return torch.where(scored.sum(dim=1) >= 2, kl, torch.zeros_like(kl))
