"""One typed schema per command: the composed config is checked against it before anything runs.

``k=abc`` or ``index.nprobe=x`` is refused with one line naming the key, the value and the expected
type; a misspelt key (``batchsize=8``) with the keys that exist. The schemas are dataclasses,
registered in Hydra's ConfigStore (``<command>_schema``) so other configs can extend them; the
``train`` group's schema is the trainer's own ``TrainConfig`` (dpr.training), left to it here.

Group schemas: ``model`` is `BiEncoderConfig` itself (closed: every key typed); ``data`` types the
keys every dataset has and leaves recipe-specific keys open (each recipe checks its own);
``index`` types every index parameter.

Generated, not restated: the keys of a stage (`EncodeConfig`, `RetrieveConfig`, `HybridConfig`, `BM25Config`,
`BM25MiningConfig`, `EvalConfig`, `BootstrapConfig`) come from its dataclass by `command_schema`, which copies each
field's type, default and range; a command adds only its own keys (its inputs, outputs and switches). So a default or
a range is written once, on the dataclass next to the code that reads it (tests/cli/test_schemas_from_dataclasses.py).

Ranges: every numeric key carries its allowed range (``ranged(default, lo, hi, note)`` field metadata from
`dpr.config`, limits from `dpr.checks`), checked by `check_config_ranges` after the types: ``weight=nan``,
``k=0`` or ``index.nprobe=0`` is one line naming the key, the value and the range. null means the documented
default ("auto"); 0 is never read as "auto". ``dpr-pipeline``'s schema types the sections it reads and
stays open to other keys.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dpr import encode_config
from dpr.checks import MAX_SHARDS, SEED, SEED_MAX
from dpr.bm25.config import BM25BuildConfig, BM25Config, BM25SearchConfig, register_schema as register_bm25
from dpr.cli.ranges import check_config_ranges, ranged
from dpr.encode_config import DenseConfig, EncodeConfig, register_schema as register_encode
from dpr.launch import register_schema as register_launch
from dpr.pipeline_scale import ScaleConfig, register_schema as register_scale
from dpr.eval.config import BootstrapConfig, EvalConfig, register_schema as register_eval
from dpr.index_config import BuildOptions
from dpr.models import BiEncoderConfig
from dpr.negatives import bm25_config as mining_config
from dpr.negatives.config import register_schema as register_remine
from dpr.negatives.bm25_config import BM25MiningConfig, register_schema as register_mining
from dpr.reader.config import ReaderConfig, register_schema as register_reader
from dpr.retrieval import config as retrieve_config
from dpr.retrieval.config import RetrieveConfig, register_schema as register_retrieve
from dpr.retrieval.fusion import HybridConfig, register_schema as register_hybrid
from dpr.training.rounds import register_schema as register_rounds

# A part of a command schema: a dataclass (every field), or (a dataclass, the names of the fields taken).
Part = Union[type, Tuple[type, Sequence[str]]]


def fields_of(cls: type, keys: Sequence[str] | None = None) -> list[tuple[str, Any, Any]]:
    """The fields ``keys`` of dataclass ``cls`` (default: every one, in its order) as `dataclasses.make_dataclass`
    specs: the same type, default and range (``ranged`` metadata), so a schema that takes them restates nothing."""
    hints = typing.get_type_hints(cls)  # the real types: the modules use `from __future__ import annotations`
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    specs = []
    for name in by_name if keys is None else keys:
        f = by_name[name]  # a KeyError here: a key that is no field of cls
        default = ({"default_factory": f.default_factory} if f.default_factory is not dataclasses.MISSING
                   else {"default": f.default})
        specs.append((name, hints[name], field(metadata=f.metadata, **default)))
    return specs


def command_schema(name: str, *parts: Part) -> type:
    """A command's (or a section's) schema: a dataclass with the fields of ``parts``, in order. The stage
    dataclasses (EncodeConfig, RetrieveConfig, ...) are the one source of their keys' types, defaults and ranges;
    a command's own keys (its inputs and outputs) are a small dataclass of their own, passed as one more part."""
    specs: list[tuple[str, Any, Any]] = []
    for part in parts:
        cls, keys = part if isinstance(part, tuple) else (part, None)
        specs += fields_of(cls, keys)
    names = [s[0] for s in specs]
    if len(set(names)) != len(names):
        raise TypeError(f"{name}: a key from two parts: {sorted({n for n in names if names.count(n) > 1})}")
    schema = dataclasses.make_dataclass(name, specs)
    schema.__module__ = __name__  # where it is defined (pickling, error messages), not dataclasses'
    return schema


@dataclass
class DataSchema:
    name: str = MISSING
    kind: Optional[str] = None
    recipe: Optional[str] = None
    mirror_dir: Optional[str] = None
    cache_dir: Optional[str] = None
    seed: Optional[int] = ranged(None, 0, SEED_MAX)


# dpr-index's / dpr-pipeline's ``index`` section: generated from BuildOptions (dpr/index_config.py), the one
# declaration of its keys, defaults and ranges
IndexSchema = command_schema("IndexSchema", BuildOptions)


@dataclass
class PrepareSchema:
    data: DataSchema = field(default_factory=DataSchema)
    data_dir: str = MISSING
    force: bool = False


@dataclass
class _Bm25Command:
    data: Optional[DataSchema] = None
    data_dir: str = MISSING
    split: str = "test"
    output: Optional[str] = None
    index_dir: Optional[str] = None
    mine: bool = False
    force: bool = False
    passages: Optional[str] = None
    qa: Optional[str] = None
    queries: Optional[str] = None
    qrels: Optional[str] = None


Bm25Schema = command_schema("Bm25Schema", _Bm25Command, BM25Config, BM25MiningConfig, BM25BuildConfig,
                            BM25SearchConfig)


@dataclass
class _EncodeCommand:
    model_path: str = MISSING
    passages: str = MISSING
    output_dir: str = MISSING
    shard_id: Optional[int] = ranged(None, 0, MAX_SHARDS - 1, note="and < num_shards; null = every shard")
    num_shards: int = ranged(1, 1, MAX_SHARDS)


EncodeSchema = command_schema("EncodeSchema", _EncodeCommand, EncodeConfig)


@dataclass
class IndexCommandSchema:
    index: IndexSchema = field(default_factory=IndexSchema)
    embeddings: str = MISSING
    output: str = MISSING


@dataclass
class _RetrieveCommand:
    mode: str = "dense"
    output: str = MISSING
    model_path: Optional[str] = None
    index_path: Optional[str] = None
    passages: Optional[str] = None
    qa: Optional[str] = None
    queries: Optional[str] = None
    qrels: Optional[str] = None
    bm25: Optional[str] = None
    dense: Optional[str] = None
    bm25_dev: Optional[str] = None
    dense_dev: Optional[str] = None
    qrels_dev: Optional[str] = None


RetrieveSchema = command_schema("RetrieveSchema", _RetrieveCommand, RetrieveConfig, HybridConfig)


@dataclass
class _EvalCommand:
    results: Any = MISSING
    names: Any = None
    output_dir: str = MISSING
    qrels: Optional[str] = None


EvalSchema = command_schema("EvalSchema", _EvalCommand, EvalConfig, BootstrapConfig)


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
    seed: int = ranged(SEED, 0, SEED_MAX)
    overwrite: bool = False
    bm25: BM25Config = field(default_factory=BM25Config)  # the BM25 teacher's index (loss=lexical_distill)


# dpr-pipeline: the sections it reads are typed and ranged, generated from their dataclasses; the schema stays open
# (the encode section becomes an EncodeConfig, so a `+encode.<key>` that is one of its fields is legal; another is
# one line naming it when the encode stage runs).
@dataclass
class _PipelineBm25Command:
    mine: bool = True


PipelineBm25 = command_schema("PipelineBm25", BM25Config, (BM25MiningConfig, mining_config.PIPELINE_KEYS),
                              _PipelineBm25Command)
# + max_length: typed and ranged where a user adds it (`+encode.max_length=128`), not in the composed section
PipelineEncode = command_schema("PipelineEncode", (EncodeConfig, encode_config.PIPELINE_KEYS + ("max_length",)))
PipelineRetrieve = command_schema("PipelineRetrieve", (RetrieveConfig, retrieve_config.PIPELINE_KEYS))
PipelineHybrid = command_schema("PipelineHybrid", HybridConfig)
PipelineEval = command_schema("PipelineEval", EvalConfig)
PipelineDense = command_schema("PipelineDense", DenseConfig)
PipelineScale = command_schema("PipelineScale", ScaleConfig)


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
    seed: int = ranged(SEED, 0, SEED_MAX)
    force: bool = False
    reader: bool = False
    until: Optional[str] = None
    bm25: PipelineBm25 = field(default_factory=PipelineBm25)
    encode: PipelineEncode = field(default_factory=PipelineEncode)
    retrieve: PipelineRetrieve = field(default_factory=PipelineRetrieve)
    hybrid: PipelineHybrid = field(default_factory=PipelineHybrid)
    eval: PipelineEval = field(default_factory=PipelineEval)
    dense: PipelineDense = field(default_factory=PipelineDense)
    scale: PipelineScale = field(default_factory=PipelineScale)
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
# the shared sections' defaults (bm25_cfg, bm25_mine_cfg, hybrid_cfg, eval_cfg, bootstrap_cfg, encode_cfg, retrieve_cfg,
# reader_cfg, and the pipeline's remine_cfg and train_rounds), for whoever composes conf/ after importing this
for _register in (register_bm25, register_mining, register_hybrid, register_eval, register_encode, register_retrieve,
                  register_reader, register_remine, register_rounds, register_scale, register_launch):
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


def _section_keys(schema: type, path: str) -> list[str] | None:
    """The keys of the section at ``path`` (dotted) of ``schema``, found through the dataclasses' field types (a
    section that defaults to null, such as ``model.lora``, has none in the structured config); None where ``path``
    is not a dataclass section."""
    node: Any = schema
    for part in path.split("."):
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            return None
        try:
            hints = typing.get_type_hints(node)
        except Exception:  # an annotation that cannot be resolved here: no answer
            return None
        if part not in hints:
            return None
        node = hints[part]
        args = [a for a in typing.get_args(node) if a is not type(None)]
        if typing.get_origin(node) in (Union, types.UnionType) and len(args) == 1:
            node = args[0]  # Optional[X] / X | None
    if isinstance(node, type) and dataclasses.is_dataclass(node):
        return [f.name for f in dataclasses.fields(node)]
    return None


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
            known = _section_keys(schema, key.rpartition(".")[0]) if "." in key else None
            if known is None:
                parent = OmegaConf.select(OmegaConf.structured(schema), key.rpartition(".")[0]) if "." in key else None
                known = sorted(parent.keys() if isinstance(parent, DictConfig) else OmegaConf.structured(schema).keys())
            raise ValueError(f"config key {key}: unknown; known keys: {', '.join(map(str, known))}") from None
        section = _section_keys(schema, key) if "is not a subclass of" in first else None
        if section is not None:  # a scalar where a section goes (model.lora=5)
            value = first.rpartition("value: ")[2] if "value: " in first else "?"
            raise ValueError(f"config key {key}: expected a section with keys {', '.join(section)} (or null), got "
                             f"{value}; e.g. {key}={{{section[0]}: ...}}") from None
        raise ValueError(f"config key {key}: {first}") from None
    check_config_ranges(merged, schema)
    return merged
