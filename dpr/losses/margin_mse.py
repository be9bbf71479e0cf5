"""Margin-MSE (Hofstätter et al., 2020): the student's positive-minus-negative margin regresses the teacher's.

For question ``i`` with scored positives ``P_i`` and scored negatives ``N_i`` (teacher score not NaN,
not ignored, :func:`dpr.losses.base.teacher_scored`)::

    loss_i = mean_{j in P_i, k in N_i} ((s_ij - s_ik) - teacher_scale * (t_ij - t_ik))**2
             + nll_weight * NLL_i

Only differences of the teacher's scores enter, so shifting all of a question's teacher scores by a
constant changes nothing (a cross-encoder's logits have no meaningful zero). ``teacher_scale`` maps the
teacher's units onto the student's (``s`` is already divided by the model's similarity temperature).
A question without a scored (positive, negative) pair contributes 0; the mean runs over all of this
rank's questions, so the DDP objective equals one process holding the global batch.
"""

from __future__ import annotations

import torch

from dpr.losses.base import LossOutput, PairMasks, Similarity, loss_output, score_pool, teacher_scored
from dpr.losses.softmax_nll import masked_softmax_nll


class MarginMSELoss:
    name = "margin_mse"
    teacher = "scores"  # the trainer puts the teacher-scores file's scores in masks.teacher

    def __init__(self, teacher_scale: float = 1.0, nll_weight: float = 0.0) -> None:
        if not teacher_scale > 0:
            raise ValueError(f"loss.teacher_scale must be > 0, got {teacher_scale}")
        if not nll_weight >= 0:
            raise ValueError(f"loss.nll_weight must be >= 0, got {nll_weight}")
        self.teacher_scale, self.nll_weight = float(teacher_scale), float(nll_weight)

    def __call__(self, q: torch.Tensor, p: torch.Tensor, masks: PairMasks, similarity: Similarity,
                 gather: bool = True) -> LossOutput:
        scores, masks = score_pool(q, p, masks, similarity, gather)
        loss = margin_mse(scores, masks, self.teacher_scale, self.name)
        if self.nll_weight:
            loss = loss + self.nll_weight * masked_softmax_nll(scores, masks)
        return loss_output(loss.mean(), scores, masks)


def margin_mse(scores: torch.Tensor, masks: PairMasks, teacher_scale: float = 1.0,
               name: str = "margin_mse") -> torch.Tensor:
    """Per-question mean squared error of the margins over its scored (positive, negative) pairs."""
    scored = teacher_scored(masks, name)
    pos = (scored & masks.positive).float()              # [B, N]
    neg = (scored & ~masks.positive).float()             # ignored pairs are not in `scored`
    # (s_j - s_k) - c (t_j - t_k) = d_j - d_k with d = s - c t; the sum over (j, k) pairs expands into
    # per-question sums, linear in the pool size (a cached-corpus pool has 10^5 candidates):
    #   sum_{j,k} (d_j - d_k)^2 = |N| sum_P d^2 - 2 sum_P d sum_N d + |P| sum_N d^2
    d = scores - torch.nan_to_num(masks.teacher.to(scores), nan=0.0) * teacher_scale
    n_pos, n_neg = pos.sum(dim=1), neg.sum(dim=1)
    err = (n_neg * (pos * d * d).sum(dim=1) - 2 * (pos * d).sum(dim=1) * (neg * d).sum(dim=1)
           + n_pos * (neg * d * d).sum(dim=1))
    return err / (n_pos * n_neg).clamp(min=1.0)
