"""The one precision rule: what ``auto`` | ``fp32`` | ``bf16`` | ``fp16`` means on a device, and its autocast.

``auto`` is bf16 on CUDA with bf16 support (else fp16) and on CPUs with native bf16
(:func:`dpr.perf.cpu.cpu_supports_bf16`, so ``DPR_NO_BF16=1`` / ``DPR_FORCE_BF16=1`` decide it everywhere),
full precision otherwise. ``off`` / ``none`` / ``false`` / ``fp32`` (or None) are full precision; ``bfloat16``
and ``float16`` are accepted for ``bf16`` and ``fp16``. Training, validation, encoding, the cross-encoder's
scoring and the reader all resolve their precision key here; a trainer adds :func:`resolve_precision`'s
``training`` checks (fp16 needs a GPU's loss scaling).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, ContextManager

import torch

from dpr.perf.cpu import cpu_supports_bf16

log = logging.getLogger(__name__)

FP32_MODES = ("off", "none", "fp32", "false")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}

# An autocast as the training steps take it: a factory of fresh contexts, a reusable context, or None (fp32).
AutocastCtx = Callable[[], ContextManager] | ContextManager | None


def autocast_dtype(device: torch.device | str, autocast: str | None = "auto") -> torch.dtype | None:
    """The dtype ``autocast`` resolves to on ``device``; None for full precision (module doc)."""
    dev = torch.device(device)
    mode = (autocast or "off").lower()
    if mode in FP32_MODES:
        return None
    if mode == "auto":
        if dev.type == "cuda":
            mode = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        elif dev.type == "cpu" and cpu_supports_bf16():
            mode = "bf16"
        else:
            return None
    if mode not in AUTOCAST_DTYPES:
        raise ValueError(f"autocast must be auto, bf16, fp16 or off; got {autocast!r}")
    return AUTOCAST_DTYPES[mode]


def resolve_precision(precision: str | None, device: torch.device | str = "cpu", *, training: bool = False) -> str:
    """``fp32``, ``bf16`` or ``fp16``: what ``precision`` runs as on ``device`` (:func:`autocast_dtype`).

    ``training``: fp16 off a GPU is refused (its loss scaling is CUDA's), and bf16 on a CPU without native
    bf16 is warned about (emulated, slower than fp32).
    """
    dev = torch.device(device)
    resolved = _name(autocast_dtype(dev, precision))
    if training and resolved == "fp16" and dev.type != "cuda":
        raise ValueError("train.precision=fp16 needs a GPU (loss scaling); use bf16 or fp32 on the CPU")
    if training and resolved == "bf16" and dev.type == "cpu" and not cpu_supports_bf16():
        log.warning("this CPU has no native bf16: bf16 autocast will be slower than fp32")
    return resolved


def _name(dtype: torch.dtype | None) -> str:
    return "fp32" if dtype is None else _NAMES[dtype]


def autocast_context(device: torch.device | str, autocast: str | None = "auto") -> contextlib.AbstractContextManager:
    """An autocast context in the dtype :func:`autocast_dtype` resolves (a null context for full precision).
    One context may be entered again and again, one ``with`` at a time (not nested)."""
    dtype = autocast_dtype(device, autocast)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def precision_context(precision: str | None, device: torch.device | str = "cpu", *,
                      training: bool = False) -> tuple[contextlib.AbstractContextManager, str]:
    """``(autocast context, resolved precision)``: :func:`autocast_context` and :func:`resolve_precision`."""
    resolved = resolve_precision(precision, device, training=training)
    return autocast_context(device, resolved), resolved


def autocast_factory(device: torch.device | str, precision: str | None) -> Callable[[], ContextManager] | None:
    """A factory of fresh autocast contexts for ``precision`` on ``device``, None for full precision (what the
    retriever's steps take, :data:`AutocastCtx`)."""
    dtype = autocast_dtype(device, precision)  # resolved once, not at every forward
    if dtype is None:
        return None
    device_type = torch.device(device).type
    return lambda: torch.autocast(device_type, dtype=dtype)


def autocast_scope(ctx: AutocastCtx) -> ContextManager:
    """A context to enter for one forward pass: ``ctx`` itself when it is a context (``torch.autocast`` instances
    can be entered repeatedly, not nested), a fresh one from a factory, a null context for None."""
    if ctx is None:
        return contextlib.nullcontext()
    if hasattr(ctx, "__enter__"):
        return ctx
    return ctx()


__all__ = ["FP32_MODES", "AUTOCAST_DTYPES", "AutocastCtx", "autocast_dtype", "resolve_precision", "autocast_context",
           "precision_context", "autocast_factory", "autocast_scope"]
