"""The ONNX Runtime encoding lever (``encode.runtime=onnx``): one tower exported to ONNX once and run by
ONNX Runtime's CPU kernels, in fp32.

What is exported is the tower's own forward (`BiEncoder.encode_passages` / ``encode_questions``:
encoder, pooling, projection, normalisation), traced by ``torch.onnx.export`` with dynamic batch and
sequence axes, so a session returns exactly what the torch tower returns, float32 ``[B, D]``.

Quality check: every export is compared with torch on a padded probe batch of another shape than
the one it was traced on and refused below :data:`EXPORT_MIN_COSINE` (a trace that baked in a shape
or dropped the padding mask fails there). Measured on all-MiniLM-L6-v2 (128 squad1_open passages,
batches of 32, 1 thread): max abs difference 2e-7, min cosine 1.0000 against torch fp32.

Speed (same run, 1 thread, AVX512 CPU shared with two other jobs, A/B interleaved, medians): about
1.8× torch eager fp32. ONNX Runtime's own graph optimisations (``ORT_ENABLE_ALL``) are used;
``onnxruntime.transformers.optimizer`` fusions were no faster. The default runtime stays ``torch``
until a quiet machine confirms the gain (README "Benchmarks").

Cache: ``<cache_dir>/<key>/<tower>.onnx``, ``key`` = sha256 over the model's content fingerprint
(`dpr.index.fingerprint.model_fingerprint`), the bi-encoder config, the tower and the exporter's
versions; written atomically (`dpr.atomic`), so a killed export leaves nothing that looks finished.

Export traces a deep copy: tracing a transformers model in place leaves it computing wrong vectors in
eager mode afterwards (seen with transformers 5 and SDPA attention). Threads: ONNX Runtime gets
``torch.get_num_threads()`` intra-op threads, so both runtimes follow the same setting.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpr.atomic import atomic_path, path_lock
from dpr.models.biencoder import BiEncoder
from dpr.perf import cpu as perf_cpu
from dpr.trainkit.precision import autocast_dtype

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "torch", "onnx")
OPSET = 17
EXPORT_MIN_COSINE = 0.999
_INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")
_OUTPUT = "vectors"
_FORMAT = 1  # bump when the exported graph changes, so old cache entries are not reused


def resolve_runtime(runtime: str | None, device: torch.device | str | None = None, autocast: str | None = "auto",
                    quantize: str = "none") -> str:
    """``torch`` or ``onnx`` for ``runtime`` in :data:`RUNTIMES` (None = torch).

    ``onnx`` runs on the CPU only (no ``device``: the CPU), in fp32 and without int8: asking for it with
    ``quantize=int8`` or bf16/fp16 ``autocast`` is refused here, before any work. ``auto`` is the fastest runtime that keeps the
    quality on this machine: ``onnx`` when the encode would run in fp32 on the CPU (``autocast`` off, or
    ``auto`` on a CPU without native bf16), the CPU has AVX-512, no int8 is asked for and onnxruntime is
    installed (~1.6x torch eager fp32 on a Zen 4 EPYC, cosine 1.0000; README "Benchmarks"); otherwise
    ``torch`` (bf16 autocast where the CPU has it beats ONNX Runtime's fp32; with AVX2 only, ONNX Runtime
    measured 0.96x torch's fp32; CUDA is torch's).
    """
    mode = (runtime or "torch").lower()
    if mode not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    if mode == "auto":
        target = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        fp32 = target.type == "cpu" and autocast_dtype("cpu", autocast) is None
        return "onnx" if fp32 and quantize == "none" and perf_cpu.cpu_has_avx512() and _installed() else "torch"
    if mode == "onnx":
        if torch.device(device or "cpu").type != "cpu":
            raise ValueError("runtime=onnx runs on the CPU only (ONNX Runtime's CPUExecutionProvider); give device=cpu")
        if quantize == "int8":
            raise ValueError("quantize=int8 and runtime=onnx are separate levers: use one of them")
        if str(autocast or "off").lower() != "auto" and autocast_dtype("cpu", autocast) is not None:
            raise ValueError(f"runtime=onnx encodes in fp32: autocast={autocast} does not apply (use auto or off)")
    return mode


def _installed() -> bool:
    import importlib.util

    try:
        return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))
    except (ImportError, ValueError):  # a module set to None in sys.modules (hidden on purpose) raises
        return False


def require_onnxruntime() -> Any:
    """The ``onnxruntime`` module, or a one-line ValueError saying what to install."""
    try:
        import onnx  # noqa: F401  (torch.onnx.export writes through it)
        import onnxruntime
    except ImportError as err:
        raise ValueError(f"runtime=onnx needs onnxruntime and onnx, not installed here ({err}): "
                         "pip install 'dpr[cpu]' (or onnxruntime onnx), or use runtime=torch") from None
    return onnxruntime


class _TowerGraph(nn.Module):
    """One tower's forward with positional inputs, as the exporter wants it."""

    def __init__(self, model: BiEncoder, tower: str, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.tower, self.names = model, tower, names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        encode = self.model.encode_questions if self.tower == "question" else self.model.encode_passages
        return encode(**dict(zip(self.names, inputs)))


class OnnxTower:
    """An exported tower in an ONNX Runtime session; called like ``BiEncoder.encode_passages``."""

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        ort = require_onnxruntime()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(threads or torch.get_num_threads())
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3  # warnings about unused initialisers and the like: not ours to fix
        self.path = Path(path)
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.input_names = tuple(i.name for i in self.session.get_inputs())

    def __call__(self, **inputs: torch.Tensor) -> torch.Tensor:
        missing = [n for n in self.input_names if inputs.get(n) is None]
        if missing:
            raise ValueError(f"{self.path.name}: the exported tower needs {missing} from the tokenizer")
        feed = {n: inputs[n].detach().cpu().numpy().astype(np.int64, copy=False) for n in self.input_names}
        return torch.from_numpy(self.session.run([_OUTPUT], feed)[0])


def input_names(tokenizer: Any) -> tuple[str, ...]:
    """The tower inputs the tokenizer produces (what `dpr.models.inference.tokenize_batch` hands the tower)."""
    produced = set(tokenizer("probe", "pair").keys())
    return tuple(k for k in _INPUT_KEYS if k in produced)


def _probe(tokenizer: Any, names: tuple[str, ...], texts: list[str]) -> dict[str, torch.Tensor]:
    batch = tokenizer(texts, padding="longest", return_tensors="pt")
    return {k: batch[k] for k in names}


def cache_key(model_key: str, model: BiEncoder, tower: str) -> str:
    import onnxruntime

    blob = json.dumps({"model": model_key, "config": model.config.to_dict(), "tower": tower, "opset": OPSET,
                       "format": _FORMAT, "torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def min_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-12)
    return float(cos.min())


def export_tower(model: BiEncoder, tokenizer: Any, tower: str, path: str | Path) -> Path:
    """Export ``tower`` of ``model`` to ``path`` (atomically), checked against torch on a probe batch."""
    names = input_names(tokenizer)
    graph = _TowerGraph(copy.deepcopy(model).cpu().float().eval(), tower, names)
    # Traced on a padded batch (row 2 masked), so the masked-attention path is what the graph records.
    example = _probe(tokenizer, names, ["an example passage, longer than the other one, to trace", "short"])
    check = _probe(tokenizer, names, ["a", "a probe of another shape", "the third probe, padded less than the rest"])
    dynamic = {n: {0: "batch", 1: "sequence"} for n in names} | {_OUTPUT: {0: "batch"}}
    path = Path(path)
    with atomic_path(path) as tmp:
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            want = graph(*(check[n] for n in names))  # before the export: tracing leaves the copy unusable
            warnings.simplefilter("ignore")  # TracerWarnings about shape constants; the check below decides
            torch.onnx.export(graph, tuple(example[n] for n in names), str(tmp), input_names=list(names),
                              output_names=[_OUTPUT], dynamic_axes=dynamic, opset_version=OPSET, dynamo=False)
        got = OnnxTower(tmp)(**check)
        cos = min_cosine(got, want)
        if not torch.isfinite(want).all():
            # a corrupt or diverged model: there is no agreement to check, and "use runtime=torch" would be the wrong
            # advice; the encoder's own check then names the model and the non-finite rows
            log.warning("the %s tower gives non-finite vectors in torch too: ONNX agreement not checked", tower)
        elif not cos >= EXPORT_MIN_COSINE:
            raise ValueError(f"ONNX export of the {tower} tower disagrees with torch (min cosine {cos:.5f} < "
                             f"{EXPORT_MIN_COSINE}); use runtime=torch")
    log.info("exported the %s tower to %s (probe min cosine vs torch %.6f)", tower, path, cos)
    return path


def onnx_tower(model: BiEncoder, tokenizer: Any, tower: str, model_key: str,
               cache_dir: str | Path | None = None, threads: int | None = None) -> OnnxTower:
    """``tower`` of ``model`` as an ONNX Runtime session: exported on first use, then loaded from the cache.

    ``model_key`` names the weights (`dpr.index.fingerprint.model_fingerprint`); ``cache_dir`` defaults to
    ``<data cache>/onnx`` (`dpr.resources.default_cache_dir`).
    """
    require_onnxruntime()
    if cache_dir is None:
        from dpr.resources import default_cache_dir

        cache_dir = default_cache_dir() / "onnx"
    path = Path(cache_dir) / cache_key(model_key, model, tower) / f"{tower}.onnx"
    if not path.is_file():
        with path_lock(path):  # another process may be exporting it: wait, then reuse its file
            if not path.is_file():
                export_tower(model, tokenizer, tower, path)
    return OnnxTower(path, threads)
