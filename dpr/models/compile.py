"""The ``torch.compile`` encoding lever: the encoding tower compiled once (``dynamic=True``), then run as usual.

Why: eager PyTorch runs every op of a small encoder as its own kernel with its own memory traffic; inductor
fuses the element-wise ops (GELU, LayerNorm, softmax, the casts under autocast) around the matmuls. Measured
before the lever existed: 1.19x in fp32 and 1.12x in bf16 on MiniLM (512 passages, batch 64), after a first
pass of 20-45 s that compiles. ``dynamic=True`` compiles one graph for every batch size and length (the
length-sorted batches change shape every batch), not one per shape.

Only the transformer (``model.passage_encoder`` / ``question_encoder``) is compiled, in place
(``nn.Module.compile``: same module, same state dict); pooling, projection and normalisation stay eager. The
vectors equal eager's up to float rounding (other kernels' summation order; tests/models/test_compile.py: cosine
>= 0.9999 on a tiny BERT), so the shard manifest records the setting and one index never mixes compiled and
eager shards (`dpr.encode`).

Inductor builds C++ kernels on the CPU: without a working C++ compiler (or where torch.compile is not
supported) :func:`require_compile` raises one line saying so, before any work. ``false`` is the default
everywhere: the compile costs more than it saves on small corpora, and ``auto`` would need the lever measured
on each kind of CPU first (``scripts/bench_encode.py``'s ``ours-compiled`` row).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from dpr.models.biencoder import BiEncoder


def resolve_compile(compile: bool | str | None, runtime: str | None = "torch", quantize: str = "none") -> bool:
    """``compile`` as a bool (None = false); True with ``runtime=onnx`` or ``quantize=int8`` is refused
    (separate levers: ONNX Runtime runs its own graph, dynamic int8 kernels are not inductor's)."""
    if compile is None:
        return False
    if isinstance(compile, str):  # a command-line string that Hydra did not type (pipeline's +encode.compile)
        if compile.strip().lower() not in ("true", "false"):
            raise ValueError(f"compile must be true or false, got {compile!r}")
        compile = compile.strip().lower() == "true"
    if not isinstance(compile, bool):
        raise ValueError(f"compile must be true or false, got {compile!r}")
    if compile and str(runtime or "torch").lower() == "onnx":
        raise ValueError("compile=true and runtime=onnx are separate levers (ONNX Runtime runs its own graph): "
                         "use one of them")
    if compile and quantize == "int8":
        raise ValueError("compile=true and quantize=int8 are separate levers: use one of them")
    return compile


@functools.lru_cache(maxsize=4)
def compile_unavailable(device_type: str = "cpu") -> str | None:
    """Why ``torch.compile`` cannot compile on ``device_type`` here (None: it can): a one-off tiny compile,
    so a missing C++ compiler shows up before a model is loaded, not in the first batch."""
    try:
        fn = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2 + 1, dynamic=True)
        out = fn(torch.ones(3, device=device_type))
        if not torch.allclose(out.cpu(), torch.nn.functional.gelu(torch.ones(3)) * 2 + 1):
            return "a test kernel computed wrong numbers"
    except Exception as err:  # noqa: BLE001 - any failure means the lever cannot run here; the reason is kept
        first = (str(err).strip().splitlines() or [""])[0][:200]
        return f"{type(err).__name__}: {first}"
    return None


def require_compile(device: torch.device | str = "cpu") -> None:
    """Raise one line when ``torch.compile`` cannot compile on ``device`` (:func:`compile_unavailable`)."""
    why = compile_unavailable(torch.device(device).type)
    if why is not None:
        raise ValueError(f"compile=true: torch.compile cannot compile on this platform ({why}); "
                           "inductor needs a working C++ compiler on the CPU. Use compile=false")


def compile_tower(model: BiEncoder, tower: str = "passage") -> BiEncoder:
    """``model`` with the encoder of ``tower`` compiled in place (``dynamic=True``); a shared model's one
    encoder serves both towers, so it is compiled once."""
    encoder: nn.Module = model.passage_encoder if tower == "passage" else model.question_encoder
    encoder.compile(dynamic=True)
    return model
