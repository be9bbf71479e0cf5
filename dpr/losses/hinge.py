"""A margin (hinge) ranking loss: every negative should score at least ``margin`` below the question's
best positive. A second loss with the same interface as :mod:`dpr.losses.softmax_nll`; it weighs all
violating negatives equally instead of by their softmax probability.

    loss_i = mean_{j negative} max(0, margin - max_{k in P_i} s_ik + s_ij)

Negatives are candidates that are neither positive nor ignored; scores are the model's similarity
(for cosine / temperature, a margin of 1.0 equals 0.05 in cosine units at temperature 0.05).
"""

from __future__ import annotations

import torch

from dpr.losses.base import LossOutput, PairMasks, Similarity, loss_output, score_pool


class HingeLoss:
    name = "hinge"

    def __init__(self, margin: float = 1.0) -> None:
        if margin <= 0:
            raise ValueError(f"loss.margin must be > 0, got {margin}")
        self.margin = float(margin)

    def __call__(self, q: torch.Tensor, p: torch.Tensor, masks: PairMasks, similarity: Similarity,
                 gather: bool = True) -> LossOutput:
        scores, masks = score_pool(q, p, masks, similarity, gather)
        neg_inf = torch.finfo(scores.dtype).min
        best_pos = scores.masked_fill(~masks.positive, neg_inf).max(dim=1, keepdim=True).values
        negatives = ~(masks.positive | masks.ignore)
        violation = torch.relu(self.margin - best_pos + scores) * negatives
        return loss_output((violation.sum(dim=1) / negatives.sum(dim=1).clamp(min=1)).mean(), scores, masks)
