"""The int8 encoding lever: dynamic int8 quantisation of every ``nn.Linear`` (weights int8 per output
channel, activations quantised per batch), activations otherwise fp32.

Measured on all-MiniLM-L6-v2 (squad1_open passages, AVX512-VNNI CPU, see README "Benchmarks"): about
2× fp32's passages/s, but the vectors drift from fp32's (min cosine ≈ 0.96; per-tensor weights ≈ 0.88;
leaving the feed-forward output layers in fp32 ≈ 0.977 and most of the speed gone). MiniLM's hidden
states have a few outlier dimensions that per-batch activation ranges cannot hold in 8 bits. So
``auto`` never picks int8: the project's quality bar for a speed lever is cosine ≥ 0.99 against fp32
on every vector and unchanged top-20 accuracy. ``int8`` stays available by name for corpora where a
user accepts the drift (check with ``scripts/bench_encode.py``).
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

QUANTIZE = ("auto", "none", "int8")


def resolve_quantize(quantize: str | None, device: torch.device | str = "cpu") -> str:
    """``none`` or ``int8`` for ``quantize`` in :data:`QUANTIZE` (None = none).

    Rule for ``auto``: ``none`` on every device. int8 would be picked on CPUs with int8 dot products
    (VNNI) only if it kept cosine ≥ 0.99 against fp32, and on MiniLM it does not (module docstring).
    """
    mode = (quantize or "none").lower()
    if mode not in QUANTIZE:
        raise ValueError(f"quantize must be one of {QUANTIZE}, got {quantize!r}")
    if mode == "int8" and torch.device(device).type != "cpu":
        raise ValueError("quantize=int8 runs on the CPU only (dynamic quantised kernels)")
    return "none" if mode == "auto" else mode


def quantize_for_inference(model: nn.Module, quantize: str | None, device: torch.device | str = "cpu") -> nn.Module:
    """``model`` itself (``none``), or an int8 copy of it for inference (``int8``); the original is untouched."""
    if resolve_quantize(quantize, device) == "none":
        return model
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch.ao's deprecation notice (moved to torchao): the API still works
        warnings.simplefilter("ignore")
        return quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear: per_channel_dynamic_qconfig},
                                dtype=torch.qint8)
