"""One source of every default: each section a dataclass owns composes to exactly its defaults, so a value
written a second time (in a YAML file) cannot come back unnoticed."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import dpr.cli.bm25  # noqa: F401  each command's module registers the groups its config composes
import dpr.cli.encode  # noqa: F401
import dpr.cli.pipeline  # noqa: F401
import dpr.cli.reader  # noqa: F401
import dpr.cli.retrieve  # noqa: F401
import dpr.cli.train  # noqa: F401
from dpr import encode_config
from dpr.bm25.config import BM25BuildConfig, BM25Config, BM25SearchConfig
from dpr.cli.common import CONF_DIR
from dpr.cli.schemas import Bm25Schema, EncodeSchema, PipelineBm25, PipelineEncode, PipelineRetrieve, RetrieveSchema
from dpr.encode_config import EncodeConfig
from dpr.launch import LaunchConfig
from dpr.eval.config import BootstrapConfig, EvalConfig
from dpr.negatives import bm25_config
from dpr.negatives.bm25_config import BM25MiningConfig
from dpr.negatives.config import RemineConfig
from dpr.reader import config as reader_config
from dpr.reader.config import ReaderConfig
from dpr.retrieval import config as retrieve_config
from dpr.retrieval.config import RetrieveConfig
from dpr.retrieval.fusion import HybridConfig


def _compose(name: str) -> dict:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return OmegaConf.to_container(compose(config_name=name), resolve=True)


def _defaults(cls: type, keys=None) -> dict:
    d = dataclasses.asdict(cls())
    return d if keys is None else {k: d[k] for k in keys}


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


# (command, section: None = the root, dataclass, the keys it takes: None = every field)
CASES = [
    ("encode", None, EncodeConfig, None),
    ("pipeline", "encode", EncodeConfig, encode_config.PIPELINE_KEYS),
    ("bm25", None, BM25Config, None),
    ("pipeline", "bm25", BM25Config, None),
    ("bm25", None, BM25MiningConfig, None),
    ("pipeline", "bm25", BM25MiningConfig, bm25_config.PIPELINE_KEYS),
    ("retrieve", None, RetrieveConfig, None),
    ("pipeline", "retrieve", RetrieveConfig, retrieve_config.PIPELINE_KEYS),
    ("retrieve", None, HybridConfig, None),
    ("pipeline", "hybrid", HybridConfig, None),
    ("eval", None, EvalConfig, None),
    ("eval", None, BootstrapConfig, None),  # resamples, seed (were restated in conf/eval.yaml and the schema)
    ("train", "bm25", BM25Config, None),  # the BM25 teacher's index settings (loss=lexical_distill)
    ("pipeline", "eval", EvalConfig, None),
    ("pipeline", "remine", RemineConfig, None),
    ("reader", "reader_cfg", ReaderConfig, None),  # nested train/eval sections: asdict recurses
    ("pipeline", "reader_cfg", ReaderConfig, None),
    ("bm25", None, BM25BuildConfig, None),  # shard_passages
    ("bm25", None, BM25SearchConfig, None),  # n_threads (was restated in conf/bm25.yaml and the schema)
    ("pipeline", None, LaunchConfig, None),  # nproc_per_node
]
IDS = [f"{c[0]}.{c[1] or 'root'}:{c[2].__name__}" for c in CASES]


@pytest.mark.parametrize("command,section,cls,keys", CASES, ids=IDS)
def test_section_is_its_dataclass_defaults(command, section, cls, keys):
    cfg = _compose(command)
    node = cfg if section is None else cfg[section]
    want = _defaults(cls, keys)
    assert {k: node[k] for k in want} == want
    if section is not None and keys is not None:  # the section holds the listed keys and nothing of cls besides
        assert not (set(node) & _fields(cls)) - set(keys)


@pytest.mark.parametrize("command,section,cls,keys", CASES, ids=IDS)
def test_no_yaml_restates_a_dataclass_default(command, section, cls, keys):
    # the values come from the group, not from the command's YAML file: read as written (before Hydra composes
    # it), the file's node for the section names no field of the dataclass
    written = yaml.safe_load(open(f"{CONF_DIR}/{command}.yaml")) or {}
    node = written if section is None else (written.get(section) or {})
    assert not set(node) & _fields(cls), (command, section, sorted(set(node) & _fields(cls)))


def test_the_reader_section_is_exactly_reader_config():
    # every reader_cfg key, nested train and eval included, comes from ReaderConfig and nothing besides
    for command in ("reader", "pipeline"):
        assert _compose(command)["reader_cfg"] == _defaults(ReaderConfig), command


def test_the_reader_ranges_reach_the_range_checker():
    # the ranges live on ReaderConfig's fields (dpr.config.ranged); the commands' schemas type reader_cfg with it
    from dpr.cli.ranges import range_rules
    from dpr.cli.schemas import SCHEMAS

    for command in ("reader", "pipeline"):
        rules = range_rules(SCHEMAS[command])
        assert {"reader_cfg.stride", "reader_cfg.train.lr", "reader_cfg.eval.ks"} <= set(rules), command
        assert rules["reader_cfg.eval.ks"][1]  # per element


def test_the_remine_section_is_exactly_remine_config():
    # the section is the remine_round<r> stages' recorded parameters: nothing else may land in it
    assert _compose("pipeline")["remine"] == _defaults(RemineConfig)


# each pipeline section that takes a part of its dataclass takes exactly these keys, in this order: the section
# is its stages' recorded parameters, so a key added there would re-run every cached stage
@pytest.mark.parametrize("section,keys", [("encode", encode_config.PIPELINE_KEYS),
                                          ("retrieve", retrieve_config.PIPELINE_KEYS)])
def test_the_pipeline_sections_are_exactly_their_stage_parameters(section, keys):
    assert list(_compose("pipeline")[section]) == list(keys)


def test_the_pipeline_bm25_section_is_the_index_and_mining_keys():
    want = _fields(BM25Config) | set(bm25_config.PIPELINE_KEYS) | {"mine"}
    assert set(_compose("pipeline")["bm25"]) == want


@pytest.mark.parametrize("schema,cls,keys", [
    (EncodeSchema, EncodeConfig, None),
    (PipelineEncode, EncodeConfig, encode_config.PIPELINE_KEYS),
    (RetrieveSchema, RetrieveConfig, None),
    (PipelineRetrieve, RetrieveConfig, retrieve_config.PIPELINE_KEYS),
    (Bm25Schema, BM25MiningConfig, None),
    (PipelineBm25, BM25MiningConfig, bm25_config.PIPELINE_KEYS),
], ids=lambda x: getattr(x, "__name__", None) or "keys")
def test_schemas_take_their_defaults_from_the_dataclass(schema, cls, keys):
    want = _defaults(cls, keys)
    assert {k: v for k, v in _defaults(schema).items() if k in want} == want
    assert set(want) <= _fields(schema)


def test_the_pipeline_encode_schema_adds_only_max_length():
    assert _defaults(PipelineEncode) == {**_defaults(EncodeConfig, encode_config.PIPELINE_KEYS), "max_length": None}


# (dataclass, its registration, a field, where it lands: (command, section: None = the root) ...)
CHANGES = [
    (EncodeConfig, encode_config.register_schema, "batch_size", [("encode", None), ("pipeline", "encode")]),
    (RetrieveConfig, retrieve_config.register_schema, "k", [("retrieve", None), ("pipeline", "retrieve")]),
    (RetrieveConfig, retrieve_config.register_schema, "batch_size", [("retrieve", None), ("pipeline", "retrieve")]),
    (BM25MiningConfig, bm25_config.register_schema, "k", [("bm25", None), ("pipeline", "bm25")]),
    (BM25MiningConfig, bm25_config.register_schema, "num_negatives", [("bm25", None), ("pipeline", "bm25")]),
    (ReaderConfig, reader_config.register_schema, "stride", [("reader", "reader_cfg"), ("pipeline", "reader_cfg")]),
]


@pytest.mark.parametrize("cls,register,key,places", CHANGES, ids=[f"{c[0].__name__}.{c[2]}" for c in CHANGES])
def test_a_changed_dataclass_default_reaches_every_command(monkeypatch, cls, register, key, places):
    """The tests above can fail: a default changed in the dataclass alone shows in every composed config."""
    def section(command, where):
        cfg = _compose(command)
        return cfg if where is None else cfg[where]

    monkeypatch.setattr(cls, "__init__", _with(cls.__init__, key, 7))
    register()
    try:
        for command, where in places:
            assert section(command, where)[key] == 7, (command, where)
    finally:
        monkeypatch.undo()
        register()
    assert section(*places[0])[key] == getattr(cls(), key)


def _with(init, key, value):
    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        setattr(self, key, value)
    return patched
