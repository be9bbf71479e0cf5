"""Matryoshka representation learning (Kusupati et al. 2022): any loss applied to nested prefixes of the vectors.

``train.matryoshka_dims=[384,192,96,48]`` wraps the configured loss: for each dimension ``d`` the first ``d``
coordinates of the question and passage vectors are scored by the model's similarity (cosine models re-normalise
each prefix there, so a prefix is scored as the unit vector ``encode.dim=d`` later returns) and the loss is

    sum_d  w_d * loss(q[:, :d], p[:, :d])

with weights ``train.matryoshka_weights`` (default 1 each), as sentence-transformers' ``MatryoshkaLoss``. Training
statistics (accuracy, rank) are the first dimension's (the full one, conventionally listed first).

``train.matryoshka_distill=λ`` (off by default) adds self-distillation, the alignment term of 2D Matryoshka
sentence embeddings (Li et al. 2024) and Espresso: each smaller prefix's softmax over the candidate pool is pulled
towards the largest size's (detached, so the teacher is not pulled down)::

    + λ * sum_{d < D}  KL( softmax(s^D_i) || softmax(s^d_i) )   (mean over questions, ignored pairs left out)

The in-batch NLL only says which passage is the positive; the full size's scores also say how the negatives rank,
which is what a small prefix has to learn to reproduce the large one's retrieval.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import torch

from dpr.losses.base import LossOutput, PairMasks, Similarity, gather_passages
from dpr.losses.kl_distill import listwise_kl
from dpr.models.truncate import truncate  # noqa: F401 (re-exported: the one truncation rule lives in dpr.models)


class MatryoshkaLoss:
    """``inner`` summed over truncated prefixes of the vectors (module docstring)."""

    def __init__(self, inner: Any, dims: Sequence[int], weights: Sequence[float] | None = None,
                 distill: float | None = None) -> None:
        dims = [int(d) for d in dims]
        if not dims or any(d < 1 for d in dims) or len(set(dims)) != len(dims):
            raise ValueError(f"train.matryoshka_dims must be distinct positive sizes, got {list(dims)}")
        weights = [1.0] * len(dims) if weights is None else [float(w) for w in weights]
        if len(weights) != len(dims) or any(not w >= 0 for w in weights) or not any(weights):
            raise ValueError(f"train.matryoshka_weights must be {len(dims)} non-negative numbers (not all 0), "
                             f"got {list(weights)}")
        distill = 0.0 if distill is None else float(distill)
        if not distill >= 0:
            raise ValueError(f"train.matryoshka_distill must be a non-negative weight, got {distill}")
        if distill and len(dims) < 2:
            raise ValueError("train.matryoshka_distill needs at least two train.matryoshka_dims (a larger size to "
                             f"distil from), got {dims}")
        self.inner, self.dims, self.weights, self.distill = inner, dims, weights, distill
        self.name = f"matryoshka({getattr(inner, 'name', type(inner).__name__)})"
        # the teacher the trainer provides scores for is the inner loss's
        if hasattr(inner, "teacher"):
            self.teacher = inner.teacher

    def __call__(self, q: torch.Tensor, p: torch.Tensor, masks: PairMasks, similarity: Similarity,
                 gather: bool = True) -> LossOutput:
        if max(self.dims) > q.shape[-1]:
            raise ValueError(f"train.matryoshka_dims {self.dims}: the model's vectors have {q.shape[-1]} dimensions")
        first: LossOutput | None = None
        total = q.new_zeros(())
        for d, w in zip(self.dims, self.weights):
            # `gather` passed on, not a pre-gathered pool: symmetric_nll reads it as "the in-batch pool"
            out = self.inner(q[:, :d], p[:, :d], masks, similarity, gather)
            total = total + w * out.loss
            first = first or out
        assert first is not None
        if self.distill:
            pool = gather_passages(p, gather)
            total = total + self.distill * self_distillation(q, pool, masks.to(q.device), similarity, self.dims)
        return replace(first, loss=total)


def self_distillation(q: torch.Tensor, pool: torch.Tensor, masks: PairMasks, similarity: Similarity,
                      dims: Sequence[int]) -> torch.Tensor:
    """``sum_{d < max(dims)} KL(softmax(s^max) || softmax(s^d))``, mean over questions; the largest size's
    scores are the detached teacher of :func:`dpr.losses.kl_distill.listwise_kl` (ignored pairs left out)."""
    top = max(dims)
    with torch.no_grad():
        teacher = similarity(q[:, :top], pool[:, :top]).float()
    as_teacher = PairMasks(masks.positive, masks.ignore, teacher)
    total = q.new_zeros((), dtype=torch.float32)
    for d in dims:
        if d != top:
            student = similarity(q[:, :d], pool[:, :d]).float()
            total = total + listwise_kl(student, as_teacher, name="matryoshka_distill").mean()
    return total
