"""How questions are retrieved: the one source of these defaults for ``dpr-retrieve`` (the keys at its root),
``dpr-pipeline`` (its ``retrieve`` section), `dpr.retrieval.runs` and `DenseRetriever`.

Registered in Hydra's ConfigStore (`register_schema`) as ``retrieve_cfg/default`` (every field: conf/retrieve.yaml
places it at the root) and ``retrieve_cfg/pipeline`` (the `PIPELINE_KEYS`: conf/pipeline.yaml places them under
``retrieve``). The hybrid's fusion and tuning settings are `dpr.retrieval.fusion.HybridConfig`'s. The fields carry
their ranges (``ranged``): the commands' schemas (`dpr.cli.schemas`) are generated from them; the functions that
take them check them again (`dpr.checks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dpr.checks import INT32_MAX, MAX_BATCH, MAX_K, MAX_LENGTH, MAX_WEIGHT
from dpr.config import ranged, register_defaults


@dataclass
class RetrieveConfig:
    k: int = ranged(100, 1, MAX_K)  # passages per question
    batch_size: int = ranged(64, 1, MAX_BATCH)  # question encoding batch
    search_batch_size: int = ranged(1024, 1, MAX_BATCH)  # questions per FAISS search call
    device: Optional[str] = None      # encoder device; null | auto: the one device rule (dpr.distributed.device)
    # auto (bf16 where the hardware has it) | bf16 | fp16 | off (Any: YAML reads a bare `off` as false)
    autocast: Any = "auto"
    # auto (= fp32: fp32 weights under autocast) | fp32 | bf16 (question encoder cast to bf16 once;
    # dpr/models/weights.py)
    weights: str = "auto"
    index_device: str = "cpu"         # gpu: shard the index over all visible GPUs
    nprobe: Optional[int] = ranged(None, 1, INT32_MAX, note="null = as saved in the index")  # IVF lists probed
    ef_search: Optional[int] = ranged(None, 1, INT32_MAX, note="null = as saved in the index")  # HNSW beam
    match: str = "string"             # has_answer matching: string | regex
    # null: the model's question_max_length
    max_length: Optional[int] = ranged(None, 1, MAX_LENGTH, note="and <= the model's positions; null = the model's")
    fusion: str = "linear"            # hybrid: linear (dense + w·bm25 after per-question min-max) | rrf
    # hybrid, linear: null = tuned on the dev result files over HybridConfig.grid by HybridConfig.metric
    weight: Optional[float] = ranged(None, 0.0, MAX_WEIGHT, note="null = tuned on dev")


# The keys of the pipeline's ``retrieve`` section (its dense retrieval stages; the others keep RetrieveConfig's
# defaults there). Left out, not added: the section is each dense retrieval stage's recorded parameters, so a new
# key would change every stage's fingerprint and re-run cached retrievals.
PIPELINE_KEYS = ("k", "batch_size", "autocast", "weights")


def register_schema() -> None:
    """``retrieve_cfg/default`` (every field) and ``retrieve_cfg/pipeline`` (`PIPELINE_KEYS`): RetrieveConfig's
    defaults, for conf/retrieve.yaml and conf/pipeline.yaml to select."""
    register_defaults("retrieve_cfg", "default", RetrieveConfig)
    register_defaults("retrieve_cfg", "pipeline", RetrieveConfig, keys=PIPELINE_KEYS)
