"""FLOPs of a BERT-like encoder forward pass, counted from the config's shapes.

Counted: every matmul of every layer on the padded batch ``[batch, seq]`` the model actually computes
on (padding included: its tokens cost the same), 2 FLOPs per multiply-add:

- projections: Q, K, V and attention output ``4 · 2·B·L·H²``; feed-forward ``2 · 2·B·L·H·I``;
- attention: scores ``Q·Kᵀ`` and ``softmax · V``, ``2 · 2·B·L²·H`` (the seq² term).

Not counted (under 1% for MiniLM): embeddings, LayerNorm, softmax, GELU, pooling. Training is taken as
3× the forward (backward = 2× forward), the usual MFU convention.
"""

from __future__ import annotations

from typing import Any, Iterable


def encoder_forward_flops(config: Any, batch: int, seq_len: int) -> int:
    """FLOPs of one forward pass over a padded ``[batch, seq_len]`` batch.

    ``config`` is any object with ``hidden_size``, ``intermediate_size`` and ``num_hidden_layers``
    (a Hugging Face BERT/MiniLM config).
    """
    h, i, n = int(config.hidden_size), int(config.intermediate_size), int(config.num_hidden_layers)
    tokens = batch * seq_len
    projections = 2 * tokens * (4 * h * h + 2 * h * i)
    attention = 4 * batch * seq_len * seq_len * h
    return n * (projections + attention)


def total_flops(config: Any, shapes: Iterable[tuple[int, int]], training: bool = False) -> int:
    """FLOPs over many ``(batch, seq_len)`` shapes; ``training`` counts forward + backward (3×)."""
    fwd = sum(encoder_forward_flops(config, b, s) for b, s in shapes)
    return 3 * fwd if training else fwd


def mfu(flops: float, seconds: float, peak_gflops: float | None) -> float | None:
    """Model FLOP utilisation: achieved FLOP/s over the peak; None without a peak or a time."""
    if not peak_gflops or seconds <= 0:
        return None
    return flops / seconds / (peak_gflops * 1e9)
