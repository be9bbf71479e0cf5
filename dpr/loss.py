"""DPR's contrastive loss: softmax cross-entropy over in-batch and hard negatives, gathered across ranks.

Layout of a batch of B questions with H hard negatives each (``passages_per_question`` = 1 + H)::

    q: [q_0, q_1, ..., q_{B-1}]
    p: [pos_0, hn_0_1 .. hn_0_H, pos_1, hn_1_1 .. hn_1_H, ...]      (B * (1 + H) rows)

Every question is scored against every passage in the pool; question i's target is its own
positive, local row ``i * (1 + H)``.

Loss scaling under DDP (W ranks, B local questions each)
--------------------------------------------------------
Passages are all-gathered with :func:`dpr.distributed.all_gather_with_grad`, whose backward sums
the gradient over ranks (the exact adjoint of the gather). Each rank's loss is the mean
cross-entropy of its *local* questions against the *global* pool of W * B * (1 + H) passages.
DDP then averages parameter gradients over ranks, so the effective objective is
``(1/W) * sum_r mean_{i in r} CE_i = mean over all W * B questions of CE_i`` -- exactly the loss
of one process holding the whole global batch, with identical gradients (tests/test_distributed.py
checks this with two processes). Questions need no gather: no rank scores another rank's
questions. The reported ``loss``/``accuracy``/``avg_rank`` are this rank's (average them with
:func:`dpr.distributed.reduce_mean` for a global figure).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from dpr import distributed


@dataclass
class LossOutput:
    """``loss`` is the tensor to backpropagate (or already backpropagated, detached, after a step);
    ``accuracy`` (positive ranked first) and ``avg_rank`` (0 = top) are floats over this rank's
    questions; ``num_candidates`` is the size of the (gathered) passage pool."""

    loss: torch.Tensor
    accuracy: float
    avg_rank: float
    num_candidates: int


def contrastive_loss(
    q: torch.Tensor,
    p: torch.Tensor,
    similarity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    passages_per_question: int | None = None,
    gather: bool = True,
    *,
    similarity_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    num_passages_per_question: int | None = None,
) -> LossOutput:
    """Mean softmax cross-entropy of each question against the pool, with its own positive as target.

    ``similarity(q, p) -> [B, N]`` scores (e.g. ``BiEncoder.similarity``, which already applies the
    temperature). ``gather=True`` under DDP widens the pool to every rank's passages (see module
    docstring for why this keeps gradients equal to a single-process run). ``similarity_fn`` and
    ``num_passages_per_question`` are keyword aliases (ARCHITECTURE.md's spelling).
    """
    similarity = similarity if similarity is not None else similarity_fn
    per_q = passages_per_question if passages_per_question is not None else num_passages_per_question
    if similarity is None or per_q is None:
        raise TypeError("contrastive_loss needs a similarity function and passages_per_question")
    if q.dim() != 2 or p.dim() != 2 or q.shape[1] != p.shape[1]:
        raise ValueError(f"expected q [B, D] and p [N, D] with the same D, got {tuple(q.shape)} and {tuple(p.shape)}")
    if per_q < 1 or p.shape[0] != q.shape[0] * per_q:
        raise ValueError(
            f"{q.shape[0]} questions x {per_q} passages per question = {q.shape[0] * per_q}, "
            f"but got {p.shape[0]} passages"
        )

    offset = 0
    pool = p
    if gather and distributed.is_distributed():
        sizes = distributed.all_gather_sizes(p.shape[0], p)
        pool = distributed.all_gather_with_grad(p, sizes)
        offset = sum(sizes[: distributed.rank()])

    scores = similarity(q, pool).float()  # fp32 softmax even under autocast
    targets = offset + torch.arange(q.shape[0], device=scores.device) * per_q
    loss = F.cross_entropy(scores, targets)

    with torch.no_grad():
        pos = scores.gather(1, targets[:, None])
        # Rank of the positive = how many candidates score strictly higher (0 = top).
        ranks = (scores > pos).sum(dim=1).float()
        accuracy = float((ranks == 0).float().mean()) if ranks.numel() else 0.0
        avg_rank = float(ranks.mean()) if ranks.numel() else 0.0
    return LossOutput(loss=loss, accuracy=accuracy, avg_rank=avg_rank, num_candidates=int(pool.shape[0]))
