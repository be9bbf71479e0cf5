"""How passages are encoded: the one source of these defaults for ``dpr-encode`` (the keys at its root),
``dpr-pipeline`` (its ``encode`` section) and `dpr.encode.encode_corpus`.

Registered in Hydra's ConfigStore (`register_schema`) as ``encode_cfg/default`` (every field: conf/encode.yaml
places it at the root) and ``encode_cfg/pipeline`` (the `PIPELINE_KEYS`: conf/pipeline.yaml places them under
``encode``). The fields carry their ranges (``ranged``): the commands' schemas (`dpr.cli.schemas`) are generated from them
and check types and ranges; `encode_corpus` checks them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from dpr.checks import INT32_MAX, MAX_BATCH, MAX_DIM, MAX_LENGTH
from dpr.config import ranged, ranged_list, register_defaults, setting


@dataclass
class EncodeConfig:
    """How passages are encoded. The settings that shard manifests began to record later declare the value older
    shards had (``recorded_before``: `dpr.config.recorded_later`): a manifest without the key reads as that value
    when `dpr.index.shard_manifest` decides whether a shard may be reused and `dpr.index.shards` whether shards
    agree (``dim`` is recorded as ``truncate_dim``)."""

    batch_size: int = ranged(64, 1, MAX_BATCH)
    dtype: str = "float16"            # storage type of the vectors: float16 | float32
    # auto (bf16 where the hardware has it) | bf16 | fp16 | off (Any: YAML reads a bare `off` as false)
    autocast: Any = "auto"
    # auto (= none: int8 misses cosine 0.99 vs fp32 on MiniLM, dpr/models/quantize.py) | none | int8 (CPU;
    # replaces autocast)
    quantize: str = "auto"
    # auto (= fp32: fp32 weights under autocast) | fp32 | bf16 (weights cast to bf16 once, no autocast;
    # dpr/models/weights.py)
    weights: str = setting("auto", recorded_before="fp32")
    # true: the passage tower through torch.compile(dynamic=True) (first batch compiles; needs a C++ compiler on
    # the CPU; dpr/models/compile.py)
    compile: bool = setting(False, recorded_before=False)
    # auto (onnx where the encode runs in fp32 on an AVX-512 CPU, else torch) | torch | onnx (ONNX Runtime, CPU,
    # fp32; graph cached by the model's fingerprint; dpr/models/onnx_runtime.py)
    runtime: str = setting("auto", recorded_before="torch")
    # null | auto: the one device rule (cuda:LOCAL_RANK if CUDA is available, else cpu) | cpu | cuda | cuda:N;
    # another value (or cuda without CUDA) is one line naming the devices available (dpr.distributed.check_device)
    device: Optional[str] = None
    max_length: Optional[int] = ranged(None, 1, MAX_LENGTH, note="and <= the model's positions; null = the model's")
    # passages pulled from Arrow per step (length-sorted within it): big enough for good length-sorting, small
    # enough that memory stays flat on a 21M-passage corpus
    chunk_size: int = ranged(16_384, 1, INT32_MAX)
    # tokens (tokenize each chunk once, batch by token count) | chars (by characters, tokenizing batch by batch:
    # sentence-transformers' rule) | none (file order); the same vectors up to rounding (dpr/models/inference.py)
    length_sort: str = "tokens"
    # Matryoshka truncation (dpr/models/truncate.py): null = the model's full vectors; d = each passage vector's first
    # d coordinates, re-normalised for a cosine model. Recorded in the manifests (``truncate_dim``); > the model's
    # size is one line before any work; a resume with another dim is refused
    dim: Optional[int] = ranged(None, 1, MAX_DIM, note="and <= the model's vector size; null = the full size",
                                recorded_before=None, recorded_as="truncate_dim")


# The keys of the pipeline's ``encode`` section. The others keep EncodeConfig's defaults there (the pipeline
# passes only these to `encode_corpus`); they are left out, not added, because the section is each encode
# stage's recorded parameters: a new key would change every stage's fingerprint and re-run cached encodes.
PIPELINE_KEYS = ("batch_size", "dtype", "autocast", "quantize", "runtime", "weights")


@dataclass
class DenseConfig:
    """The pipeline's ``dense`` section: the dimensions of its dense systems (Matryoshka truncation,
    dpr/models/truncate.py). Registered as ``dense_cfg/default``; with both at their defaults no stage changes.

    ``dim``: the ``dense`` and ``dense_untrained`` systems encoded at that dimension (``encode.dim``; null = full).
    ``dims``: for each d an extra system ``dense@<d>``: the trained model's passage vectors of ``dense/embeddings``
    truncated to d (no re-encode: `dpr.index.truncate.truncate_embeddings`), its own index, test and dev retrieval,
    reported beside ``dense``. The hybrid stays ``dense``'s."""

    dim: Optional[int] = ranged(None, 1, MAX_DIM, note="null = the model's full size")
    dims: List[int] = ranged_list(1, MAX_DIM)

    def check(self, full: int | None = None) -> "DenseConfig":
        """Each size usable (distinct, each below ``dense.dim`` when set and <= ``full``, the model's size when
        known): a ValueError naming the key and the sizes otherwise. Returns self."""
        for key, d in (("dense.dim", self.dim), *(("dense.dims", d) for d in self.dims)):
            if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
                raise ValueError(f"{key} must hold positive integers, got {d!r}")
            if d is not None and full is not None and d > full:
                raise ValueError(f"{key}: {d} is larger than the {full} dimensions of the model's vectors")
        if len(set(self.dims)) != len(self.dims):
            raise ValueError(f"dense.dims must be distinct sizes, got {list(self.dims)}")
        if self.dim is not None and any(d >= self.dim for d in self.dims):
            raise ValueError(f"dense.dims {list(self.dims)}: each must be smaller than dense.dim={self.dim} "
                             "(they truncate the dense system's vectors)")
        return self


def register_schema() -> None:
    """``encode_cfg/default`` (every field) and ``encode_cfg/pipeline`` (`PIPELINE_KEYS`): EncodeConfig's
    defaults, for conf/encode.yaml and conf/pipeline.yaml to select; ``dense_cfg/default``: DenseConfig's, for
    conf/pipeline.yaml's ``dense`` section."""
    register_defaults("encode_cfg", "default", EncodeConfig)
    register_defaults("encode_cfg", "pipeline", EncodeConfig, keys=PIPELINE_KEYS)
    register_defaults("dense_cfg", "default", DenseConfig)
