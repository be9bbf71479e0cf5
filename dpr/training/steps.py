"""What one micro-batch's step scores: the loss bound to the batch's masks and negative sources.

- a **two-tower step** (:func:`dpr.training.grad_cache.standard_step` or the gradient cache) encodes the
  batch's questions and passages; the pool is every rank's passages (gathered with gradients), plus,
  with corpus negatives, the cached corpus vectors (no gradients);
- a **frozen-index step** (:func:`frozen_index_step`) encodes only the questions and scores them against
  the cached corpus (whole, or each batch's FAISS top-k): no passage forward or backward pass.

Either way the loss is one of :mod:`dpr.losses`, called with the full candidate matrix and its masks.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

from dpr.losses import LossOutput, gather_passages
from dpr.training.corpus_negatives import CorpusNegatives
from dpr.training.data import Batch
from dpr.training.grad_cache import AutocastCtx, Inputs, _autocast


def bind_loss(loss, similarity, batch: Batch, *, corpus: CorpusNegatives | None, frozen: bool, accum: int,
              scaler, outputs: list) -> Callable[[torch.Tensor, torch.Tensor | None], LossOutput]:
    """``loss_fn(q, p)`` for one micro-batch; each call's raw output is appended to ``outputs``."""

    def loss_fn(q: torch.Tensor, p: torch.Tensor | None) -> LossOutput:
        copies = 0
        if frozen:
            cands = corpus.extra(q, batch.questions)
            pool, masks = cands.vectors.to(q.device), cands.masks
        else:
            pool = gather_passages(p, gather=True)
            masks = batch.masks
            if corpus is not None:
                cands = corpus.extra(q, batch.questions, batch.pool_ids)
                pool = torch.cat([pool, cands.vectors.to(pool.device, pool.dtype)])
                masks, copies = masks.cat(cands.masks), cands.copies
        res = loss(q, pool, masks, similarity, gather=False)
        # logged "masked" = false negatives removed; cached copies of in-batch passages are not counted
        res = dataclasses.replace(res, masked=res.masked - copies)
        outputs.append(res)
        # accumulation averages micro-batch gradients; fp16 scales the loss (scaler is a no-op otherwise)
        return dataclasses.replace(res, loss=scaler.scale(res.loss / accum))

    return loss_fn


def frozen_index_step(model: nn.Module, q_inputs: Inputs, p_inputs: Inputs | None, loss_fn,
                      autocast_ctx: AutocastCtx = None) -> LossOutput:
    """Question tower forward/backward only; the loss scores against fixed corpus vectors."""
    with _autocast(autocast_ctx):
        q, _ = model(q_inputs, None)
    out = loss_fn(q.float(), None)
    out.loss.backward()
    return dataclasses.replace(out, loss=out.loss.detach())
