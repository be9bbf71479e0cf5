"""One typed schema per command: the composed config is checked against it before anything runs.

``k=abc`` or ``index.nprobe=x`` is refused with one line naming the key, the value and the expected
type; a misspelt key (``batchsize=8``) with the keys that exist. The schemas are dataclasses,
registered in Hydra's ConfigStore (``<command>_schema``) so other configs can extend them; the
``train`` group's schema is the trainer's own ``TrainConfig`` (dpr.training), left to it here.

Group schemas: ``model`` is `BiEncoderConfig` itself (closed: every key typed); ``data`` types the
keys every dataset has and leaves recipe-specific keys open (each recipe checks its own);
``index`` types every index parameter.

Ranges: every numeric key carries its allowed range (``ranged(default, lo, hi, note)`` field metadata from
`dpr.cli.ranges`, limits from `dpr.checks`), checked by `check_config_ranges` after the types: ``weight=nan``,
``k=0`` or ``index.nprobe=0`` is one line naming the key, the value and the range. null means the documented
default ("auto"); 0 is never read as "auto". ``dpr-pipeline``'s schema types the sections it reads and
stays open to other keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dpr.checks import (INT32_MAX, MAX_BATCH, MAX_K, MAX_K1, MAX_K_RRF, MAX_LENGTH, MAX_RESAMPLES, MAX_SHARDS,
                        MAX_THREADS, MAX_WEIGHT, SEED_MAX)
from dpr.bm25.config import BM25Config, register_schema as register_bm25
from dpr.cli.ranges import check_config_ranges, ranged, ranged_list
from dpr.encode_config import EncodeConfig, register_schema as register_encode
from dpr.eval.config import EvalConfig, register_schema as register_eval
from dpr.models import BiEncoderConfig
from dpr.negatives.config import register_schema as register_remine
from dpr.negatives.bm25_config import BM25MiningConfig, register_schema as register_mining
from dpr.reader.config import ReaderConfig, register_schema as register_reader
from dpr.retrieval.config import RetrieveConfig, register_schema as register_retrieve
from dpr.retrieval.fusion import HybridConfig, register_schema as register_hybrid
from dpr.training.rounds import register_schema as register_rounds

# The defaults of the sections several commands share come from their dataclass (the one source; the YAML
# files select them as config groups): the schemas here only type and range them.
_BM25, _MINE, _HYBRID, _EVAL = BM25Config(), BM25MiningConfig(), HybridConfig(), EvalConfig()
_ENCODE, _RETRIEVE = EncodeConfig(), RetrieveConfig()


@dataclass
class DataSchema:
    name: str = MISSING
    kind: Optional[str] = None
    recipe: Optional[str] = None
    mirror_dir: Optional[str] = None
    cache_dir: Optional[str] = None
    seed: Optional[int] = ranged(None, 0, SEED_MAX)


@dataclass
class IndexSchema:
    # null = auto (FAISS's default, or the value derived from the data / saved in the index); 0 is refused
    # (faiss reads 0 lists or a 0-wide beam as "return nothing", and HNSW0 aborts the process)
    factory: str = "Flat"      # parsed by dpr.index.factory before FAISS sees it
    metric: str = "ip"
    device: str = "cpu"
    add_batch_size: int = ranged(65536, 1, INT32_MAX)
    ef_construction: Optional[int] = ranged(None, 1, INT32_MAX, note="null = faiss's 40")
    ef_search: Optional[int] = ranged(None, 1, INT32_MAX, note="null = faiss's 16 / as saved")
    nlist: Optional[int] = ranged(None, 1, INT32_MAX, note="null = about 4*sqrt(N)")
    m: Optional[int] = ranged(None, 1, INT32_MAX, note="null = largest divisor of dim <= dim/8")
    train_sample: Optional[int] = ranged(None, 1, INT32_MAX, note="null = every vector")
    nprobe: Optional[int] = ranged(None, 1, INT32_MAX, note="null = faiss's 1 / as saved")
    seed: Optional[int] = ranged(None, 0, SEED_MAX)


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
    k: int = ranged(_MINE.k, 1, MAX_K)
    n_threads: int = ranged(0, -1, MAX_THREADS, note="0 = the calling thread, -1 = all cores")
    k1: float = ranged(_BM25.k1, 0.0, MAX_K1)
    b: float = ranged(_BM25.b, 0.0, 1.0)
    stopwords: Any = _BM25.stopwords
    stemmer: Optional[str] = _BM25.stemmer
    index_dir: Optional[str] = None
    mine: bool = False
    num_negatives: int = ranged(_MINE.num_negatives, 1, MAX_K)
    depth: int = ranged(_MINE.depth, 1, MAX_K)
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
    shard_id: Optional[int] = ranged(None, 0, MAX_SHARDS - 1, note="and < num_shards; null = every shard")
    num_shards: int = ranged(1, 1, MAX_SHARDS)
    batch_size: int = ranged(_ENCODE.batch_size, 1, MAX_BATCH)
    dtype: str = _ENCODE.dtype
    autocast: Any = _ENCODE.autocast  # Any: YAML reads a bare `off` as false
    quantize: str = _ENCODE.quantize
    runtime: str = _ENCODE.runtime
    device: Optional[str] = _ENCODE.device
    max_length: Optional[int] = ranged(_ENCODE.max_length, 1, MAX_LENGTH,
                                       note="and <= the model's positions; null = the model's")
    chunk_size: int = ranged(_ENCODE.chunk_size, 1, INT32_MAX)
    weights: str = _ENCODE.weights
    compile: bool = _ENCODE.compile
    length_sort: str = _ENCODE.length_sort


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
    k: int = ranged(_RETRIEVE.k, 1, MAX_K)
    batch_size: int = ranged(_RETRIEVE.batch_size, 1, MAX_BATCH)
    search_batch_size: int = ranged(_RETRIEVE.search_batch_size, 1, MAX_BATCH)
    device: Optional[str] = _RETRIEVE.device
    autocast: Any = _RETRIEVE.autocast  # Any: YAML reads a bare `off` as false
    weights: str = _RETRIEVE.weights
    index_device: str = _RETRIEVE.index_device
    nprobe: Optional[int] = ranged(_RETRIEVE.nprobe, 1, INT32_MAX, note="null = as saved in the index")
    ef_search: Optional[int] = ranged(_RETRIEVE.ef_search, 1, INT32_MAX, note="null = as saved in the index")
    match: str = _RETRIEVE.match
    max_length: Optional[int] = ranged(_RETRIEVE.max_length, 1, MAX_LENGTH,
                                       note="and <= the model's positions; null = the model's")
    bm25: Optional[str] = None
    dense: Optional[str] = None
    fusion: str = _RETRIEVE.fusion
    weight: Optional[float] = ranged(_RETRIEVE.weight, 0.0, MAX_WEIGHT, note="null = tuned on dev")
    normalize: str = _HYBRID.normalize
    bm25_dev: Optional[str] = None
    dense_dev: Optional[str] = None
    qrels_dev: Optional[str] = None
    grid: List[float] = ranged_list(0.0, MAX_WEIGHT, default=lambda: list(_HYBRID.grid))
    metric: str = _HYBRID.metric
    metric_k: int = ranged(_HYBRID.metric_k, 1, MAX_K)
    k_rrf: float = ranged(_HYBRID.k_rrf, 0.0, MAX_K_RRF)


@dataclass
class EvalSchema:
    results: Any = MISSING
    names: Any = None
    output_dir: str = MISSING
    qrels: Optional[str] = None
    ks: List[int] = ranged_list(1, MAX_K, default=lambda: list(_EVAL.ks))
    match: str = _EVAL.match
    resamples: int = ranged(1000, 1, MAX_RESAMPLES)
    seed: int = ranged(0, 0, SEED_MAX)


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
    seed: int = ranged(42, 0, SEED_MAX)
    overwrite: bool = False


# dpr-pipeline: the sections it reads are typed and ranged; the schema stays open (the encode and bm25
# sections are passed on as keyword arguments, so a `+encode.<key>` the function takes is legal).
@dataclass
class PipelineBm25:
    k1: float = ranged(_BM25.k1, 0.0, MAX_K1)
    b: float = ranged(_BM25.b, 0.0, 1.0)
    stopwords: Any = _BM25.stopwords
    stemmer: Optional[str] = _BM25.stemmer
    k: int = ranged(_MINE.k, 1, MAX_K)
    mine: bool = True
    num_negatives: int = ranged(_MINE.num_negatives, 1, MAX_K)


@dataclass
class PipelineEncode:
    batch_size: int = ranged(_ENCODE.batch_size, 1, MAX_BATCH)
    dtype: str = _ENCODE.dtype
    autocast: Any = _ENCODE.autocast
    quantize: str = _ENCODE.quantize
    runtime: str = _ENCODE.runtime
    max_length: Optional[int] = ranged(_ENCODE.max_length, 1, MAX_LENGTH,
                                       note="and <= the model's positions; null = the model's")
    weights: str = _ENCODE.weights


@dataclass
class PipelineRetrieve:
    k: int = ranged(_RETRIEVE.k, 1, MAX_K)
    batch_size: int = ranged(_RETRIEVE.batch_size, 1, MAX_BATCH)
    autocast: Any = _RETRIEVE.autocast
    weights: str = _RETRIEVE.weights


@dataclass
class PipelineHybrid:
    grid: List[float] = ranged_list(0.0, MAX_WEIGHT, default=lambda: list(_HYBRID.grid))
    metric: str = _HYBRID.metric
    metric_k: int = ranged(_HYBRID.metric_k, 1, MAX_K)
    normalize: str = _HYBRID.normalize
    k_rrf: float = ranged(_HYBRID.k_rrf, 0.0, MAX_K_RRF)


@dataclass
class PipelineEval:
    ks: List[int] = ranged_list(1, MAX_K, default=lambda: list(_EVAL.ks))
    match: str = _EVAL.match


# dpr-reader (and dpr-pipeline's reader=true): reader_cfg is `dpr.reader.config.ReaderConfig`, the one source of
# the reader's defaults, types and ranges.
@dataclass
class ReaderSchema:
    reader_cfg: ReaderConfig = field(default_factory=ReaderConfig)
    data: DataSchema = field(default_factory=DataSchema)
    data_dir: str = MISSING
    output_dir: str = MISSING
    overwrite: bool = False  # train: replace a finished run of other settings (dpr/trainkit/finished_run.py)
    reader_model: Optional[str] = None
    results: Optional[str] = None
    gold_split: Optional[str] = None
    output: Optional[str] = None


@dataclass
class PipelineSchema:
    data: DataSchema = field(default_factory=DataSchema)
    index: IndexSchema = field(default_factory=IndexSchema)
    model: Any = None      # BiEncoderConfig, TrainConfig, the loss and the reader check their own groups
    train: Any = None
    loss: Any = None
    logger: Any = None
    reader_cfg: ReaderConfig = field(default_factory=ReaderConfig)
    data_dir: str = MISSING
    output_dir: str = MISSING
    seed: int = ranged(42, 0, SEED_MAX)
    force: bool = False
    reader: bool = False
    until: Optional[str] = None
    bm25: PipelineBm25 = field(default_factory=PipelineBm25)
    encode: PipelineEncode = field(default_factory=PipelineEncode)
    retrieve: PipelineRetrieve = field(default_factory=PipelineRetrieve)
    hybrid: PipelineHybrid = field(default_factory=PipelineHybrid)
    eval: PipelineEval = field(default_factory=PipelineEval)
    remine: Any = None     # RemineConfig checks its own section (types and ranges), before any stage runs


SCHEMAS: Dict[str, type] = {
    "prepare": PrepareSchema, "bm25": Bm25Schema, "encode": EncodeSchema, "index": IndexCommandSchema,
    "retrieve": RetrieveSchema, "eval": EvalSchema, "train": TrainCommandSchema, "pipeline": PipelineSchema,
    "reader": ReaderSchema,
}
# Schemas whose keys are typed where named but stay open to others.
OPEN_SCHEMAS = (PipelineSchema,)
# Groups whose recipe-specific keys stay open (typed where the schema names them).
OPEN_GROUPS = {"data": DataSchema}

_cs = ConfigStore.instance()
for _name, _schema in SCHEMAS.items():
    _cs.store(name=f"{_name}_schema", node=_schema)
# the shared sections' defaults (bm25_cfg, bm25_mine_cfg, hybrid_cfg, eval_cfg, encode_cfg, retrieve_cfg, reader_cfg,
# and the pipeline's remine_cfg and train_rounds), for whoever composes conf/ after importing this
for _register in (register_bm25, register_mining, register_hybrid, register_eval, register_encode, register_retrieve,
                  register_reader, register_remine, register_rounds):
    _register()


def _schema_node(schema: type, cfg: DictConfig) -> DictConfig:
    node = OmegaConf.structured(schema)
    if schema in OPEN_SCHEMAS:
        OmegaConf.set_struct(node, False)
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


def check_config(cfg: DictConfig, schema: type) -> DictConfig:
    """Raise ValueError (one line) if ``cfg`` has a key the schema lacks, a value of the wrong type or one
    outside its range (`check_config_ranges`); returns the config as the schema types it."""
    missing = sorted(k for k in OmegaConf.missing_keys(cfg) if not k.startswith("hydra"))
    if missing:
        raise ValueError(f"config key {missing[0]}: required, give {missing[0]}=<value>"
                         + (f" (also missing: {', '.join(missing[1:])})" if len(missing) > 1 else ""))
    try:
        merged = OmegaConf.merge(_schema_node(schema, cfg),
                                 OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "not in" in first:
            parent = OmegaConf.select(OmegaConf.structured(schema), key.rpartition(".")[0]) if "." in key else None
            known = sorted(parent.keys() if isinstance(parent, DictConfig) else OmegaConf.structured(schema).keys())
            raise ValueError(f"config key {key}: unknown; known keys: {', '.join(map(str, known))}") from None
        raise ValueError(f"config key {key}: {first}") from None
    check_config_ranges(merged, schema)
    return merged
