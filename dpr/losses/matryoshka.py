"""Matryoshka representation learning (Kusupati et al. 2022): any loss applied to nested prefixes of the vectors.

``train.matryoshka_dims=[384,192,96,48]`` wraps the configured loss: for each dimension ``d`` the first ``d``
coordinates of the question and passage vectors are scored by the model's similarity (cosine models re-normalise
each prefix there, so a prefix is scored as the unit vector ``encode.dim=d`` later returns) and the loss is

    sum_d  w_d * loss(q[:, :d], p[:, :d])

with weights ``train.matryoshka_weights`` (default 1 each), as sentence-transformers' ``MatryoshkaLoss``. Training
statistics (accuracy, rank) are the first dimension's (the full one, conventionally listed first).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import torch

from dpr.losses.base import LossOutput, PairMasks, Similarity
from dpr.models.truncate import truncate  # noqa: F401 (re-exported: the one truncation rule lives in dpr.models)


class MatryoshkaLoss:
    """``inner`` summed over truncated prefixes of the vectors (module docstring)."""

    def __init__(self, inner: Any, dims: Sequence[int], weights: Sequence[float] | None = None) -> None:
        dims = [int(d) for d in dims]
        if not dims or any(d < 1 for d in dims) or len(set(dims)) != len(dims):
            raise ValueError(f"train.matryoshka_dims must be distinct positive sizes, got {list(dims)}")
        weights = [1.0] * len(dims) if weights is None else [float(w) for w in weights]
        if len(weights) != len(dims) or any(not w >= 0 for w in weights) or not any(weights):
            raise ValueError(f"train.matryoshka_weights must be {len(dims)} non-negative numbers (not all 0), "
                             f"got {list(weights)}")
        self.inner, self.dims, self.weights = inner, dims, weights
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
            out = self.inner(q[:, :d], p[:, :d], masks, similarity, gather)
            total = total + w * out.loss
            first = first or out
        assert first is not None
        return replace(first, loss=total)
