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

from dpr.losses.base import LossOutput, PairMasks, Similarity, loss_output, score_pool


class SoftmaxNLLLoss:
    """Mean over this rank's questions of the masked multi-positive softmax NLL (see module docstring)."""

    name = "softmax_nll"

    def __call__(self, q: torch.Tensor, p: torch.Tensor, masks: PairMasks, similarity: Similarity,
                 gather: bool = True) -> LossOutput:
        scores, masks = score_pool(q, p, masks, similarity, gather)
        return loss_output(masked_softmax_nll(scores, masks).mean(), scores, masks)


def masked_softmax_nll(scores: torch.Tensor, masks: PairMasks) -> torch.Tensor:
    """Per-question ``logsumexp(valid) - logsumexp(positives)`` for ``[B, N]`` scores."""
    neg_inf = torch.finfo(scores.dtype).min
    valid = scores.masked_fill(masks.ignore, neg_inf)
    positives = scores.masked_fill(~masks.positive, neg_inf)
    return torch.logsumexp(valid, dim=1) - torch.logsumexp(positives, dim=1)

