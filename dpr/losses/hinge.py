"""A margin (hinge) ranking loss: every negative should score at least ``margin`` below the question's
best positive. A second loss with the same interface as :mod:`dpr.losses.softmax_nll`; it weighs all
violating negatives equally instead of by their softmax probability.

    loss_i = mean_{j negative} max(0, margin - max_{k in P_i} s_ik + s_ij)

Negatives are candidates that are neither positive nor ignored; scores are the model's similarity
(for cosine / temperature, a margin of 1.0 equals 0.05 in cosine units at temperature 0.05).
"""

from __future__ import annotations

import torch

from dpr.losses.base import LossOutput, PairMasks, Similarity, gather_passages, rank_stats
from dpr.losses.softmax_nll import _check


class HingeLoss:
    name = "hinge"

    def __init__(self, margin: float = 1.0) -> None:
        if margin <= 0:
            raise ValueError(f"loss.margin must be > 0, got {margin}")
        self.margin = float(margin)

    def __call__(self, q: torch.Tensor, p: torch.Tensor, masks: PairMasks, similarity: Similarity,
                 gather: bool = True) -> LossOutput:
        _check(q, p)
        pool = gather_passages(p, gather)
        masks = masks.to(q.device)
        masks.validate(q.shape[0], pool.shape[0])
        scores = similarity(q, pool).float()
        neg_inf = torch.finfo(scores.dtype).min
        best_pos = scores.masked_fill(~masks.positive, neg_inf).max(dim=1, keepdim=True).values
        negatives = ~(masks.positive | masks.ignore)
        violation = torch.relu(self.margin - best_pos + scores) * negatives
        loss = (violation.sum(dim=1) / negatives.sum(dim=1).clamp(min=1)).mean()
        accuracy, avg_rank = rank_stats(scores, masks)
        return LossOutput(loss=loss, accuracy=accuracy, avg_rank=avg_rank, num_candidates=int(pool.shape[0]),
                          masked=int(masks.ignore.sum()))
