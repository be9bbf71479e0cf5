"""How questions are retrieved: the one source of these defaults for ``dpr-retrieve`` (the keys at its root),
``dpr-pipeline`` (its ``retrieve`` section), `dpr.retrieval.runs` and `DenseRetriever`.

Registered in Hydra's ConfigStore (`register_schema`) as ``retrieve_cfg/default`` (every field: conf/retrieve.yaml
places it at the root) and ``retrieve_cfg/pipeline`` (the `PIPELINE_KEYS`: conf/pipeline.yaml places them under
``retrieve``). The hybrid's fusion and tuning settings are `dpr.retrieval.fusion.HybridConfig`'s. Types and ranges
are checked by the commands' schemas (`dpr.cli.schemas`) and by the functions that take them (`dpr.checks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dpr.config import register_defaults


@dataclass
class RetrieveConfig:
    k: int = 100                      # passages per question
    batch_size: int = 64              # question encoding batch
    search_batch_size: int = 1024     # questions per FAISS search call
    device: Optional[str] = None      # encoder device; null | auto: the one device rule (dpr.distributed.device)
    autocast: str = "auto"            # auto (bf16 where the hardware has it) | bf16 | fp16 | off
    # auto (= fp32: fp32 weights under autocast) | fp32 | bf16 (question encoder cast to bf16 once;
    # dpr/models/weights.py)
    weights: str = "auto"
    index_device: str = "cpu"         # gpu: shard the index over all visible GPUs
    nprobe: Optional[int] = None      # IVF lists probed (null: as saved in the index)
    ef_search: Optional[int] = None   # HNSW beam (null: as saved in the index)
    match: str = "string"             # has_answer matching: string | regex
    max_length: Optional[int] = None  # null: the model's question_max_length
    fusion: str = "linear"            # hybrid: linear (dense + w·bm25 after per-question min-max) | rrf
    # hybrid, linear: null = tuned on the dev result files over HybridConfig.grid by HybridConfig.metric
    weight: Optional[float] = None


# The keys of the pipeline's ``retrieve`` section (its dense retrieval stages; the others keep RetrieveConfig's
# defaults there). Left out, not added: the section is each dense retrieval stage's recorded parameters, so a new
# key would change every stage's fingerprint and re-run cached retrievals.
PIPELINE_KEYS = ("k", "batch_size", "autocast", "weights")


def register_schema() -> None:
    """``retrieve_cfg/default`` (every field) and ``retrieve_cfg/pipeline`` (`PIPELINE_KEYS`): RetrieveConfig's
    defaults, for conf/retrieve.yaml and conf/pipeline.yaml to select."""
    register_defaults("retrieve_cfg", "default", RetrieveConfig)
    register_defaults("retrieve_cfg", "pipeline", RetrieveConfig, keys=PIPELINE_KEYS)
