"""DPR's NLL plus the passage-to-question direction: each positive passage must also pick out its question.

The forward term is :mod:`dpr.losses.softmax_nll` (question ``i`` against every candidate). The reverse
term (sentence-transformers' ``MultipleNegativesSymmetricRankingLoss``; the "passage-centric" loss of
PAIR, Ren et al. 2021) scores each positive passage ``j`` of question ``i`` against every question ``k``
of the (global) batch::

    rev_j  = -log( sum_{k : j in P_k} exp s_kj  /  sum_{k : j not in I_k} exp s_kj )
    loss_i = fwd_i + passage_weight * mean_{j in P_i} rev_j

so a passage is pulled to its own question and pushed from the batch's other questions: the question
tower's vectors get negatives too. Ignored pairs (a passage that holds another question's answer, another
judged document) leave the reverse denominators as they leave the forward ones.

The reverse term needs the batch's own passages as candidates, so it is computed when the call gathers
this rank's passages (``gather=True``, the in-batch pool); candidates from a cached corpus
(``gather=False``: frozen-index steps, the whole-corpus term) get the forward term only. Under DDP the
questions and the masks' rows are all-gathered (questions with gradients, through the same adjoint
gather as the passages), each rank adds the reverse terms of its own questions' positives, and the mean
over ranks equals one process holding the global batch.
"""

from __future__ import annotations

import torch

from dpr import distributed
from dpr.losses.base import LossOutput, PairMasks, Similarity, gather_passages, loss_output, score_pool
from dpr.losses.softmax_nll import masked_softmax_nll


class SymmetricSoftmaxNLLLoss:
    """Mean over this rank's questions of the forward NLL plus ``passage_weight`` x the reverse NLL."""

    name = "symmetric_nll"

    def __init__(self, passage_weight: float = 1.0) -> None:
        if not passage_weight >= 0:
            raise ValueError(f"loss.passage_weight must be >= 0, got {passage_weight}")
        self.passage_weight = float(passage_weight)

    def __call__(self, q: torch.Tensor, p: torch.Tensor, masks: PairMasks, similarity: Similarity,
                 gather: bool = True) -> LossOutput:
        pool = gather_passages(p, gather)
        if not (gather and self.passage_weight > 0):
            scores, masks = score_pool(q, pool, masks, similarity, gather=False)
            return loss_output(masked_softmax_nll(scores, masks).mean(), scores, masks)
        # Every question of the global batch against the pool, scored once: this rank's rows are its forward
        # scores, the columns give the reverse terms. Questions are gathered with gradients (the adjoint
        # gather), the masks' rows without.
        sizes = distributed.all_gather_sizes(q.shape[0], q)
        rows = slice(sum(sizes[: distributed.rank()]), sum(sizes[: distributed.rank() + 1]))
        q_all = distributed.all_gather_with_grad(q, sizes)
        masks = masks.to(q.device)
        masks_all = PairMasks(distributed.all_gather_with_grad(masks.positive.float(), sizes) > 0.5,
                              distributed.all_gather_with_grad(masks.ignore.float(), sizes) > 0.5)
        scores_all, masks_all = score_pool(q_all, pool, masks_all, similarity, gather=False)
        scores = scores_all[rows]
        loss = masked_softmax_nll(scores, masks) + self.passage_weight * _reverse(scores_all, masks_all, masks)
        return loss_output(loss.mean(), scores, masks)


def _reverse(scores_all: torch.Tensor, masks_all: PairMasks, masks: PairMasks) -> torch.Tensor:
    """Per local question: the mean reverse NLL of its positives (columns) over the global questions."""
    neg_inf = torch.finfo(scores_all.dtype).min
    valid = torch.logsumexp(scores_all.masked_fill(masks_all.ignore, neg_inf), dim=0)
    own = torch.logsumexp(scores_all.masked_fill(~masks_all.positive, neg_inf), dim=0)
    per_column = torch.where(masks_all.positive.any(dim=0), valid - own, torch.zeros_like(valid))  # [N]
    local = masks.positive.float()
    return (local * per_column).sum(dim=1) / local.sum(dim=1)
