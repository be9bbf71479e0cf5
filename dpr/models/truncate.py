"""Matryoshka truncation: the first ``d`` coordinates of a vector, the one rule every consumer applies.

The loss (`dpr.losses.matryoshka`, which re-exports `truncate`), the encoder (``encode.dim``: `dpr.encode`), the
truncated shards of ``dense.dims`` (`dpr.index.truncate`) and the question side of retrieval over a truncated index
(`dpr.retrieval.retriever.DenseRetriever`) all call `truncate`, so passages and questions are cut alike: the
prefix, re-normalised to unit length for cosine models (inner products stay cosines), kept as is for dot-product
models.
"""

from __future__ import annotations

from typing import Any

import torch


def truncate(vectors: torch.Tensor, dim: int | None, normalize: bool) -> torch.Tensor:
    """The first ``dim`` coordinates of each row (None or the full size: unchanged), re-normalised to unit length
    for cosine models (``normalize``) so inner products stay cosines."""
    if dim is None or dim >= vectors.shape[-1]:
        return vectors
    if dim < 1:
        raise ValueError(f"encode.dim must be >= 1, got {dim}")
    out = vectors[..., :dim]
    return torch.nn.functional.normalize(out, p=2, dim=-1) if normalize else out.contiguous()


def check_dim(dim: Any, full: int | None, what: str, key: str = "dim") -> int | None:
    """``dim`` as the truncation size to apply to ``full``-dimensional vectors: None when it keeps every coordinate
    (null, or the full size); a ValueError naming ``key``, ``what`` and both sizes when it cannot be applied
    (not a positive integer, or larger than ``full``; ``full`` None: unknown yet, only the type is checked)."""
    if dim is None:
        return None
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"{key} must be a positive integer (or null for the full size), got {dim!r}")
    if full is not None and dim > full:
        raise ValueError(f"{key}={dim} is larger than the {full} dimensions of {what}'s vectors")
    return None if full is not None and dim == full else dim
