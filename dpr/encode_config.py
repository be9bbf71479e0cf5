"""How passages are encoded: the one source of these defaults for ``dpr-encode`` (the keys at its root),
``dpr-pipeline`` (its ``encode`` section) and `dpr.encode.encode_corpus`.

Registered in Hydra's ConfigStore (`register_schema`) as ``encode_cfg/default`` (every field: conf/encode.yaml
places it at the root) and ``encode_cfg/pipeline`` (the `PIPELINE_KEYS`: conf/pipeline.yaml places them under
``encode``). The fields carry their ranges (``ranged``): the commands' schemas (`dpr.cli.schemas`) are generated from them
and check types and ranges; `encode_corpus` checks them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dpr.checks import INT32_MAX, MAX_BATCH, MAX_LENGTH
from dpr.config import ranged, register_defaults


@dataclass
class EncodeConfig:
    batch_size: int = ranged(64, 1, MAX_BATCH)
    dtype: str = "float16"            # storage type of the vectors: float16 | float32
    # auto (bf16 where the hardware has it) | bf16 | fp16 | off (Any: YAML reads a bare `off` as false)
    autocast: Any = "auto"
    # auto (= none: int8 misses cosine 0.99 vs fp32 on MiniLM, dpr/models/quantize.py) | none | int8 (CPU;
    # replaces autocast)
    quantize: str = "auto"
    # auto (= fp32: fp32 weights under autocast) | fp32 | bf16 (weights cast to bf16 once, no autocast;
    # dpr/models/weights.py)
    weights: str = "auto"
    # true: the passage tower through torch.compile(dynamic=True) (first batch compiles; needs a C++ compiler on
    # the CPU; dpr/models/compile.py)
    compile: bool = False
    # auto (onnx where the encode runs in fp32 on an AVX-512 CPU, else torch) | torch | onnx (ONNX Runtime, CPU,
    # fp32; graph cached by the model's fingerprint; dpr/models/onnx_runtime.py)
    runtime: str = "auto"
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


# The keys of the pipeline's ``encode`` section. The others keep EncodeConfig's defaults there (the pipeline
# passes only these to `encode_corpus`); they are left out, not added, because the section is each encode
# stage's recorded parameters: a new key would change every stage's fingerprint and re-run cached encodes.
PIPELINE_KEYS = ("batch_size", "dtype", "autocast", "quantize", "runtime", "weights")


def register_schema() -> None:
    """``encode_cfg/default`` (every field) and ``encode_cfg/pipeline`` (`PIPELINE_KEYS`): EncodeConfig's
    defaults, for conf/encode.yaml and conf/pipeline.yaml to select."""
    register_defaults("encode_cfg", "default", EncodeConfig)
    register_defaults("encode_cfg", "pipeline", EncodeConfig, keys=PIPELINE_KEYS)
