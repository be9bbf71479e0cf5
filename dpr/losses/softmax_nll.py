"""DPR's softmax NLL over in-batch and hard negatives, generalised to several positives and masked pairs.

For question ``i`` with positives ``P_i``, ignored candidates ``I_i`` and all candidates ``C``::

    loss_i = -log( sum_{j in P_i} exp s_ij  /  sum_{j in C \\ I_i} exp s_ij )

With one positive and nothing ignored this is exactly DPR's cross-entropy with the positive as target.
Several positives (every judged-relevant document of a qrels query that is in the pool) share the
probability mass (the "multi-positive" softmax, as in multi-label contrastive learning); an ignored
pair (a false negative) is removed from the denominator, so the loss never pushes it away.
"""

from __future__ import annotations

import torch

from dpr.losses.base import LossOutput, PairMasks, Similarity, gather_passages, rank_stats


class SoftmaxNLLLoss:
    """Mean over this rank's questions of the masked multi-positive softmax NLL (see module docstring)."""

    name = "softmax_nll"

    def __call__(self, q: torch.Tensor, p: torch.Tensor, masks: PairMasks, similarity: Similarity,
                 gather: bool = True) -> LossOutput:
        _check(q, p)
        pool = gather_passages(p, gather)
        masks = masks.to(q.device)
        masks.validate(q.shape[0], pool.shape[0])
        scores = similarity(q, pool).float()  # fp32 softmax even under autocast
        loss = masked_softmax_nll(scores, masks).mean()
        accuracy, avg_rank = rank_stats(scores, masks)
        return LossOutput(loss=loss, accuracy=accuracy, avg_rank=avg_rank, num_candidates=int(pool.shape[0]),
                          masked=int(masks.ignore.sum()))


def masked_softmax_nll(scores: torch.Tensor, masks: PairMasks) -> torch.Tensor:
    """Per-question ``logsumexp(valid) - logsumexp(positives)`` for ``[B, N]`` scores."""
    neg_inf = torch.finfo(scores.dtype).min
    valid = scores.masked_fill(masks.ignore, neg_inf)
    positives = scores.masked_fill(~masks.positive, neg_inf)
    return torch.logsumexp(valid, dim=1) - torch.logsumexp(positives, dim=1)


def _check(q: torch.Tensor, p: torch.Tensor) -> None:
    if q.dim() != 2 or p.dim() != 2 or q.shape[1] != p.shape[1]:
        raise ValueError(f"expected q [B, D] and p [N, D] with the same D, got {tuple(q.shape)} and {tuple(p.shape)}")
