"""The bf16-weights encoding lever: the encoder's weights cast to bf16 once, instead of autocast recasting
every ``nn.Linear`` weight on every forward.

Autocast keeps fp32 master weights and casts each weight to bf16 inside each batch's autocast context
(its cast cache lives only as long as that context, which `dpr.models.inference` enters per batch);
on a small model and short texts those casts are a visible share of a forward. With ``weights=bf16``
the model is converted once and runs without autocast, so every op -- LayerNorm, softmax and the
pooling's normalisation included -- computes in bf16; the vectors are returned in fp32 as always.

``auto`` is ``fp32`` (today's path: fp32 weights, ``autocast`` as resolved) on every device. Like
``quantize`` (`dpr.models.quantize`), ``auto`` would pick the lever only where it keeps the quality bar
(cosine >= 0.99 against the autocast vectors on every vector and an unchanged top-k ranking) on a real
model; tests/models/test_bf16_weights.py checks that bar on a tiny random BERT only, so ``bf16`` is opt-in by
name until it is measured on MiniLM (``scripts/bench_encode.py``'s ``ours-bf16-weights`` row).
"""

from __future__ import annotations

import torch
from torch import nn

from dpr.trainkit.precision import FP32_MODES, autocast_dtype

WEIGHTS = ("auto", "fp32", "bf16")


def resolve_weights(weights: str | None, device: torch.device | str | None = None, autocast: str | None = "auto",
                    quantize: str = "none", runtime: str = "torch") -> str:
    """``fp32`` or ``bf16`` for ``weights`` in :data:`WEIGHTS` (None = auto = fp32, module doc).

    ``bf16`` computes in bf16 whatever ``autocast`` says, so an explicit full-precision or fp16 autocast
    contradicts it, as do the int8 and ONNX levers (they encode from fp32 weights): refused here, before
    any work, with one line naming both settings.
    """
    mode = str(weights or "auto").lower()
    if mode not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    if mode != "bf16":
        return "fp32"
    if quantize == "int8":
        raise ValueError("weights=bf16 and quantize=int8 are separate levers: use one of them")
    if runtime == "onnx":
        raise ValueError("weights=bf16 and runtime=onnx are separate levers (ONNX Runtime encodes in fp32): "
                         "use one of them")
    mode_ac = str(autocast or "off").lower()
    target = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if mode_ac in FP32_MODES or (mode_ac != "auto" and autocast_dtype(target, autocast) == torch.float16):
        raise ValueError(f"weights=bf16 encodes in bf16: autocast={autocast} contradicts it (use auto or bf16)")
    return "bf16"


def inference_autocast(weights: str, autocast: str | None) -> str | None:
    """The autocast to encode with: none over bf16 weights (every op already runs in bf16), else ``autocast``."""
    return "off" if weights == "bf16" else autocast


def cast_weights(model: nn.Module, weights: str) -> nn.Module:
    """``model`` with its parameters and buffers in bf16 (in place) for ``weights=bf16``; untouched for fp32."""
    return model.to(torch.bfloat16) if weights == "bf16" else model
