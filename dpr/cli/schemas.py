"""One typed schema per command: the composed config is checked against it before anything runs.

``k=abc`` or ``index.nprobe=x`` is refused with one line naming the key, the value and the expected
type; a misspelt key (``batchsize=8``) with the keys that exist. The schemas are dataclasses,
registered in Hydra's ConfigStore (``<command>_schema``) so other configs can extend them; the
``train`` group's schema is the trainer's own ``TrainConfig`` (dpr.training), left to it here.

Group schemas: ``model`` is `BiEncoderConfig` itself (closed: every key typed); ``data`` types the
keys every dataset has and leaves recipe-specific keys open (each recipe checks its own);
``index`` types every index parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dpr.models import BiEncoderConfig


@dataclass
class DataSchema:
    name: str = MISSING
    kind: Optional[str] = None
    recipe: Optional[str] = None
    mirror_dir: Optional[str] = None
    cache_dir: Optional[str] = None
    seed: Optional[int] = None


@dataclass
class IndexSchema:
    factory: str = "Flat"
    metric: str = "ip"
    device: str = "cpu"
    add_batch_size: int = 65536
    ef_construction: Optional[int] = None
    ef_search: Optional[int] = None
    nlist: Optional[int] = None
    m: Optional[int] = None
    train_sample: Optional[int] = None
    nprobe: Optional[int] = None
    seed: Optional[int] = None


@dataclass
class PrepareSchema:
    data: DataSchema = field(default_factory=DataSchema)
    data_dir: str = MISSING
    force: bool = False


@dataclass
class Bm25Schema:
    data: Optional[DataSchema] = None
    data_dir: str = MISSING
    split: str = "test"
    output: Optional[str] = None
    k: int = 100
    n_threads: int = 0
    k1: float = 0.9
    b: float = 0.4
    stopwords: Any = "en"
    stemmer: Optional[str] = None
    index_dir: Optional[str] = None
    mine: bool = False
    num_negatives: int = 30
    depth: int = 100
    force: bool = False
    passages: Optional[str] = None
    qa: Optional[str] = None
    queries: Optional[str] = None
    qrels: Optional[str] = None


@dataclass
class EncodeSchema:
    model_path: str = MISSING
    passages: str = MISSING
    output_dir: str = MISSING
    shard_id: Optional[int] = None
    num_shards: int = 1
    batch_size: int = 64
    dtype: str = "float16"
    autocast: Any = "auto"
    quantize: str = "auto"
    runtime: str = "auto"
    device: Optional[str] = None
    max_length: Optional[int] = None
    chunk_size: int = 16384


@dataclass
class IndexCommandSchema:
    index: IndexSchema = field(default_factory=IndexSchema)
    embeddings: str = MISSING
    output: str = MISSING


@dataclass
class RetrieveSchema:
    mode: str = "dense"
    output: str = MISSING
    model_path: Optional[str] = None
    index_path: Optional[str] = None
    passages: Optional[str] = None
    qa: Optional[str] = None
    queries: Optional[str] = None
    qrels: Optional[str] = None
    k: int = 100
    batch_size: int = 64
    search_batch_size: int = 1024
    device: Optional[str] = None
    autocast: Any = "auto"
    index_device: str = "cpu"
    nprobe: Optional[int] = None
    ef_search: Optional[int] = None
    match: str = "string"
    max_length: Optional[int] = None
    bm25: Optional[str] = None
    dense: Optional[str] = None
    fusion: str = "linear"
    weight: Optional[float] = None
    normalize: str = "minmax"
    bm25_dev: Optional[str] = None
    dense_dev: Optional[str] = None
    qrels_dev: Optional[str] = None
    grid: List[float] = field(default_factory=list)
    metric: str = "mrr"
    metric_k: int = 100
    k_rrf: float = 60.0


@dataclass
class EvalSchema:
    results: Any = MISSING
    names: Any = None
    output_dir: str = MISSING
    qrels: Optional[str] = None
    ks: List[int] = field(default_factory=lambda: [1, 5, 10, 20, 50, 100])
    match: str = "string"
    resamples: int = 1000
    seed: int = 0


@dataclass
class TrainCommandSchema:
    model: BiEncoderConfig = field(default_factory=BiEncoderConfig)
    data: DataSchema = field(default_factory=DataSchema)
    train: Any = None     # TrainConfig (dpr.training) checks its own group
    loss: Any = None      # conf/loss/<name>.yaml: _target_ + the loss's own keys (checked when it is built)
    logger: Any = None
    data_dir: str = MISSING
    output_dir: str = MISSING
    train_file: Optional[str] = None  # re-mining rounds train on their own file
    seed: int = 42
    overwrite: bool = False


SCHEMAS: Dict[str, type] = {
    "prepare": PrepareSchema, "bm25": Bm25Schema, "encode": EncodeSchema, "index": IndexCommandSchema,
    "retrieve": RetrieveSchema, "eval": EvalSchema, "train": TrainCommandSchema,
}
# Groups whose recipe-specific keys stay open (typed where the schema names them).
OPEN_GROUPS = {"data": DataSchema}

_cs = ConfigStore.instance()
for _name, _schema in SCHEMAS.items():
    _cs.store(name=f"{_name}_schema", node=_schema)


def _schema_node(schema: type, cfg: DictConfig) -> DictConfig:
    node = OmegaConf.structured(schema)
    for group, group_schema in OPEN_GROUPS.items():
        if group not in node:
            continue
        if cfg.get(group) is None:
            node[group] = None  # an optional group not chosen (dpr-bm25 without data=)
            continue
        if node[group] is None:
            node[group] = OmegaConf.structured(group_schema)
        OmegaConf.set_struct(node[group], False)
    return node


def check_config(cfg: DictConfig, schema: type) -> None:
    """Raise ValueError (one line) if ``cfg`` has a key the schema lacks or a value of the wrong type."""
    missing = sorted(k for k in OmegaConf.missing_keys(cfg) if not k.startswith("hydra"))
    if missing:
        raise ValueError(f"config key {missing[0]}: required, give {missing[0]}=<value>"
                         + (f" (also missing: {', '.join(missing[1:])})" if len(missing) > 1 else ""))
    try:
        OmegaConf.merge(_schema_node(schema, cfg), OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "not in" in first:
            parent = OmegaConf.select(OmegaConf.structured(schema), key.rpartition(".")[0]) if "." in key else None
            known = sorted(parent.keys() if isinstance(parent, DictConfig) else OmegaConf.structured(schema).keys())
            raise ValueError(f"config key {key}: unknown; known keys: {', '.join(map(str, known))}") from None
        raise ValueError(f"config key {key}: {first}") from None
