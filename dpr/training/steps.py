"""What one micro-batch's step scores: the loss bound to the batch's masks and negative sources.

- a **two-tower step** (:func:`standard_step` or the gradient cache, :func:`make_step` picks) encodes the
  batch's questions and passages; the pool is every rank's passages (gathered with gradients); with
  corpus negatives a second loss term scores the questions against the cached corpus (no gradients);
- a **frozen-index step** (:func:`frozen_index_step`) encodes only the questions and scores them against
  the cached corpus (whole, or each batch's FAISS top-k): no passage forward or backward pass.

Either way the loss is one of :mod:`dpr.losses`, called with the full candidate matrix and its masks.
:func:`optimizer_step` runs a step's micro-batches through one of them, then the kit's update
(`dpr.trainkit.optim.apply_update`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import torch
from torch import nn

from dpr.losses import LossOutput
from dpr.training.corpus_negatives import CorpusNegatives
from dpr.training.batching import Batch
from dpr.training.grad_cache import Inputs, grad_cache_step
from dpr.trainkit.optim import apply_update
from dpr.trainkit.precision import AutocastCtx, autocast_scope


def standard_step(
    model: nn.Module, q_inputs: Inputs, p_inputs: Inputs, loss_fn: Callable[[torch.Tensor, torch.Tensor], LossOutput],
    autocast_ctx: AutocastCtx = None, bucket_size: int = 0,
) -> LossOutput:
    """Encode the whole batch with graphs, compute the loss (in fp32) and backpropagate it.

    ``bucket_size > 0``: each tower encodes its texts in length-sorted buckets of that many rows, inside
    the one forward (:mod:`dpr.models.length_buckets`: the same vectors, far fewer padded tokens).
    """
    with autocast_scope(autocast_ctx):
        q, p = model(q_inputs, p_inputs, bucket_size=bucket_size) if bucket_size > 0 else model(q_inputs, p_inputs)
    out = loss_fn(q.float(), p.float())
    out.loss.backward()
    return dataclasses.replace(out, loss=out.loss.detach())


def make_step(chunk_size: int | None, bucket_size: int = 0) -> Callable[..., LossOutput]:
    """``standard_step`` (length buckets of ``bucket_size`` rows) when ``chunk_size`` is falsy, else
    ``grad_cache_step`` with that chunk size (its chunks already pad only to their own longest)."""
    if not chunk_size:
        if bucket_size <= 0:
            return standard_step

        def bucketed(model: nn.Module, q_inputs: Inputs, p_inputs: Inputs, loss_fn: Any,
                     autocast_ctx: AutocastCtx = None):
            return standard_step(model, q_inputs, p_inputs, loss_fn, autocast_ctx, bucket_size)

        return bucketed

    def step(model: nn.Module, q_inputs: Inputs, p_inputs: Inputs, loss_fn: Any, autocast_ctx: AutocastCtx = None):
        return grad_cache_step(model, q_inputs, p_inputs, loss_fn, chunk_size, autocast_ctx)

    return step


def bind_loss(loss, similarity, batch: Batch, *, corpus: CorpusNegatives | None, frozen: bool, accum: int,
              scaler, outputs: list) -> Callable[[torch.Tensor, torch.Tensor | None], LossOutput]:
    """``loss_fn(q, p)`` for one micro-batch; each call's raw output is appended to ``outputs``."""

    def loss_fn(q: torch.Tensor, p: torch.Tensor | None) -> LossOutput:
        if frozen:
            cands = corpus.extra(q, batch.questions)
            res = loss(q, cands.vectors.to(q.device), cands.masks, similarity, gather=False)
        else:
            res = loss(q, p, batch.masks, similarity, gather=True)  # the loss gathers every rank's passages
            if corpus is not None:
                # A second term against the cached corpus, its targets the cached copies of the positives.
                # Appending cached rows to the fresh in-batch pool instead lets the question tower learn
                # "fresh = positive, cached = negative" (the passage tower drifts between refreshes),
                # which hurt dev in the ablation; inside one term every candidate is equally stale.
                cands = corpus.extra(q, batch.questions)
                extra = loss(q, cands.vectors.to(q.device), cands.masks, similarity, gather=False)
                res = dataclasses.replace(res, loss=res.loss + extra.loss, masked=res.masked + extra.masked,
                                          num_candidates=res.num_candidates + extra.num_candidates)
        outputs.append(res)
        # accumulation averages micro-batch gradients; fp16 scales the loss (scaler is a no-op otherwise)
        return dataclasses.replace(res, loss=scaler.scale(res.loss / accum))

    return loss_fn


def frozen_index_step(model: nn.Module, q_inputs: Inputs, p_inputs: Inputs | None, loss_fn,
                      autocast_ctx: AutocastCtx = None) -> LossOutput:
    """Question tower forward/backward only; the loss scores against fixed corpus vectors."""
    with autocast_scope(autocast_ctx):
        q, _ = model(q_inputs, None)
    out = loss_fn(q.float(), None)
    out.loss.backward()
    return dataclasses.replace(out, loss=out.loss.detach())


def optimizer_step(train_model, micro_batches, *, step_fn, autocast, optimizer, scheduler, scaler,
                   max_grad_norm: float, device: torch.device) -> tuple[float, float]:
    """One optimizer step over ``micro_batches`` (``(q_inputs, p_inputs or None, loss_fn)`` each): ``(lr, grad_norm)``.

    ``optimizer.param_groups`` hold the parameters to clip. Under DDP gradients are all-reduced only
    on the last micro-batch.
    """
    for i, (q_in, p_in, loss_fn) in enumerate(micro_batches):
        q_in = {k: v.to(device, non_blocking=True) for k, v in q_in.items()}
        p_in = {k: v.to(device, non_blocking=True) for k, v in p_in.items()} if p_in is not None else None
        sync = i == len(micro_batches) - 1 or not hasattr(train_model, "no_sync")
        with contextlib.nullcontext() if sync else train_model.no_sync():
            step_fn(train_model, q_in, p_in, loss_fn, autocast)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return apply_update(params, optimizer, scheduler, max_grad_norm, scaler)
