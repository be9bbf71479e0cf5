"""The encoder protocol: what the rest of dpr may assume of a dense retriever model, whatever its backbone.

Code outside `dpr.models` holds a model through this protocol (and `unwrap_encoder` for DDP-wrapped ones), never
through a concrete class; the run directory's format is `dpr.models.run_format`'s alone. Building, loading and
saving are module functions (`dpr.models.build_biencoder`, `load_biencoder`, `save_biencoder`); tokenising is
`dpr.models.inference.tokenize_batch` with the tokenizer they return (set up for the backbone by
`dpr.models.backbone.load_tokenizer`).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class DenseEncoder(Protocol):
    """Two towers (possibly one shared) that turn token ids into vectors, and the score between them."""

    config: Any  # a BiEncoderConfig: pooling, similarity, lengths, prefixes, backbone keys
    # The towers and their projections, for callers that freeze layers (dpr.training), check lengths against a
    # tower's positions (dpr.encode, dpr.retrieval), set or export the projections (dpr.training.projection_init,
    # dpr.export): with shared towers, the passage tower and projection are the question ones.
    question_encoder: nn.Module
    question_projection: nn.Linear | None

    @property
    def passage_encoder(self) -> nn.Module: ...

    @property
    def passage_projection(self) -> nn.Linear | None: ...

    @property
    def hidden_size(self) -> int:
        """The towers' hidden size (the pooled vectors' size before any projection)."""
        ...

    @property
    def dim(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor: ...

    def encode_questions(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         token_type_ids: torch.Tensor | None = None) -> torch.Tensor: ...

    def encode_passages(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        token_type_ids: torch.Tensor | None = None) -> torch.Tensor: ...

    def similarity(self, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor: ...

    def forward(self, q_inputs: Mapping[str, torch.Tensor] | None = None,
                p_inputs: Mapping[str, torch.Tensor] | None = None, bucket_size: int = 0) -> Any: ...


def is_encoder(model: Any) -> bool:
    """True for a module that implements :class:`DenseEncoder` (unwrapped)."""
    return isinstance(model, nn.Module) and isinstance(model, DenseEncoder)


def find_encoder(model: nn.Module) -> nn.Module:
    """The :class:`DenseEncoder` inside DistributedDataParallel (or any ``.module``) wrappers; ``model`` itself when
    none is found (the caller decides whether that is an error)."""
    while not is_encoder(model) and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


def unwrap_encoder(model: nn.Module) -> nn.Module:
    """:func:`find_encoder`, or a TypeError naming what was passed instead."""
    found = find_encoder(model)
    if not is_encoder(found):
        raise TypeError(f"expected a dense encoder (dpr.models.DenseEncoder), got {type(model).__name__}")
    return found
