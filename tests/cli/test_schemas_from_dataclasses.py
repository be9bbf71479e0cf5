"""Every command's schema and the stage dataclass it takes its keys from agree on every key, type, default and range
(`dpr.cli.schemas.command_schema` generates them: a default or a range exists once, on the dataclass), and a value a
dataclass's range refuses is refused by the command with one line naming the key (a property over random values).

Exhaustive over the (command, section, dataclass) cases; hypothesis over the values."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
from hydra import compose, initialize_config_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf, open_dict

from dpr import encode_config
from dpr.bm25.config import BM25Config
from dpr.cli.common import CONF_DIR
from dpr.cli.ranges import range_rules
from dpr.cli.schemas import SCHEMAS, check_config, command_schema, fields_of
from dpr.config import Range
from dpr.encode_config import EncodeConfig
from dpr.eval.config import BootstrapConfig, EvalConfig
from dpr.negatives import bm25_config
from dpr.negatives.bm25_config import BM25MiningConfig
from dpr.reader.config import ReaderConfig
from dpr.retrieval import config as retrieve_config
from dpr.retrieval.config import RetrieveConfig
from dpr.retrieval.fusion import HybridConfig

# (command, section of its schema: "" = the root, the dataclass, the keys it takes: None = every field)
CASES = [
    ("encode", "", EncodeConfig, None),
    ("pipeline", "encode", EncodeConfig, encode_config.PIPELINE_KEYS + ("max_length",)),
    ("retrieve", "", RetrieveConfig, None),
    ("retrieve", "", HybridConfig, None),
    ("pipeline", "retrieve", RetrieveConfig, retrieve_config.PIPELINE_KEYS),
    ("pipeline", "hybrid", HybridConfig, None),
    ("bm25", "", BM25Config, None),
    ("bm25", "", BM25MiningConfig, None),
    ("pipeline", "bm25", BM25Config, None),
    ("pipeline", "bm25", BM25MiningConfig, bm25_config.PIPELINE_KEYS),
    ("train", "bm25", BM25Config, None),
    ("eval", "", EvalConfig, None),
    ("eval", "", BootstrapConfig, None),
    ("pipeline", "eval", EvalConfig, None),
    ("reader", "reader_cfg", ReaderConfig, None),
    ("pipeline", "reader_cfg", ReaderConfig, None),
]
IDS = [f"{c[0]}.{c[1] or 'root'}:{c[2].__name__}" for c in CASES]
STAGE_CONFIGS = sorted({c[2] for c in CASES}, key=lambda c: c.__name__)


def _section(schema: type, path: str) -> type:
    for part in filter(None, path.split(".")):
        tp = typing.get_type_hints(schema)[part]
        schema = next(t for t in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(t))
    return schema


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _keys(cls: type, keys) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)] if keys is None else list(keys)


def _is_numeric(tp) -> bool:
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    inner = args[0]
    if typing.get_origin(inner) in (list, typing.List):
        inner = typing.get_args(inner)[0]
    return inner in (int, float)


@pytest.mark.parametrize("command,section,cls,keys", CASES, ids=IDS)
def test_schema_and_dataclass_agree_on_every_key_type_default_and_range(command, section, cls, keys):
    schema = _section(SCHEMAS[command], section)
    got = {f.name: f for f in dataclasses.fields(schema)}
    want = {f.name: f for f in dataclasses.fields(cls)}
    got_types, want_types = typing.get_type_hints(schema), typing.get_type_hints(cls)
    rules = range_rules(SCHEMAS[command])
    for key in _keys(cls, keys):
        assert key in got, f"{command}: {section}.{key} missing from the schema"
        where = f"{command}: {(section + '.' if section else '')}{key}"
        assert got_types[key] == want_types[key], where
        assert _default(got[key]) == _default(want[key]), where
        assert got[key].metadata.get("range") == want[key].metadata.get("range"), where
        assert bool(got[key].metadata.get("each")) == bool(want[key].metadata.get("each")), where
        if "range" in want[key].metadata:  # and the checker of composed configs reads it
            assert rules[(section + "." if section else "") + key][0] == want[key].metadata["range"], where


@pytest.mark.parametrize("cls", STAGE_CONFIGS, ids=lambda c: c.__name__)
def test_every_numeric_field_of_a_stage_config_carries_its_range(cls):
    def walk(c):
        hints = typing.get_type_hints(c)
        for f in dataclasses.fields(c):
            if dataclasses.is_dataclass(hints[f.name]):
                yield from walk(hints[f.name])
            elif _is_numeric(hints[f.name]):
                yield f

    numeric = list(walk(cls))
    assert numeric, cls
    for f in numeric:
        assert isinstance(f.metadata.get("range"), Range), f"{cls.__name__}.{f.name} has no range"


def test_a_generated_schema_is_its_parts_and_refuses_a_key_twice():
    schema = command_schema("S", BM25Config, (BM25MiningConfig, ("k",)))
    assert [f.name for f in dataclasses.fields(schema)] == ["k1", "b", "stopwords", "stemmer", "k"]
    assert dataclasses.asdict(schema()) == {**dataclasses.asdict(BM25Config()), "k": BM25MiningConfig().k}
    assert schema().__class__.__module__ == "dpr.cli.schemas"
    ks = [spec for spec in fields_of(EvalConfig) if spec[0] == "ks"][0][2]
    assert ks.default_factory() is not ks.default_factory()  # a list default is a fresh list per instance
    with pytest.raises(TypeError, match=r"a key from two parts: \['k'\]"):
        command_schema("T", BM25MiningConfig, (BM25MiningConfig, ("k",)))


def test_a_changed_dataclass_range_reaches_the_command():
    """The agreement above is by construction: a schema generated from a dataclass whose range changed has it."""
    narrower = dataclasses.field(default=64, metadata={"range": Range(1, 8, optional=True)})
    Narrow = dataclasses.make_dataclass("Narrow", [("batch_size", int, narrower)])
    schema = command_schema("NarrowSchema", Narrow)
    assert range_rules(schema)["batch_size"][0] == Range(1, 8, optional=True)


# ------------------------------------------------------------------ the property: refused iff out of range
FILL = {"encode": {"model_path": "m", "passages": "p", "output_dir": "o"}, "retrieve": {"output": "o"},
        "eval": {"results": ["r"], "output_dir": "o"}, "train": {"output_dir": "o"}}
OVERRIDES = {"bm25": ["data=squad1_open"], "train": ["data=squad1_open"]}
COMMANDS = sorted({c[0] for c in CASES})


@pytest.fixture(scope="module")
def composed() -> dict:
    import dpr.cli.pipeline  # noqa: F401  each command's module registers the groups its config composes
    import dpr.cli.train  # noqa: F401
    import dpr.cli.reader  # noqa: F401

    out = {}
    for command in COMMANDS:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=command, overrides=OVERRIDES.get(command, []))
        with open_dict(cfg):
            for key, value in FILL.get(command, {}).items():
                OmegaConf.update(cfg, key, value, merge=False)
        check_config(cfg, SCHEMAS[command])  # the shipped defaults are legal
        out[command] = cfg
    return out


def _numeric_cases() -> list[tuple[str, str, type, bool, Range]]:
    """(command, dotted key, int or float, a list, the dataclass's range) of every ranged key the cases take."""
    out = []
    for command, section, cls, keys in CASES:
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in _keys(cls, keys):
            rule = fields[key].metadata.get("range")
            if rule is None or dataclasses.is_dataclass(hints[key]):
                continue
            kind = float if "float" in str(hints[key]) else int
            out.append((command, (section + "." if section else "") + key, kind, bool(fields[key].metadata.get("each")),
                        rule))
    return out


NUMERIC = _numeric_cases()


@st.composite
def _case_and_value(draw):
    command, key, kind, each, rule = draw(st.sampled_from(NUMERIC))
    edges = [0, -1, 1, rule.lo, rule.hi, 2 ** 31, 2 ** 63]
    if kind is int:
        value = draw(st.one_of(st.sampled_from([int(e) for e in edges if e is not None]),
                               st.integers(-2 ** 64, 2 ** 64)))
    else:
        value = draw(st.one_of(st.sampled_from([float(e) for e in edges if e is not None]),
                               st.floats(allow_nan=True, allow_infinity=True)))
    return command, key, each, rule, value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_case_and_value())
def test_a_value_is_refused_by_the_command_iff_its_dataclass_range_refuses_it(composed, case):
    command, key, each, rule, value = case
    cfg = composed[command].copy()
    with open_dict(cfg):
        OmegaConf.update(cfg, key, [value] if each else value, merge=False)
    if rule.allows(value):  # finite, in its bounds
        assert math.isfinite(value)
        check_config(cfg, SCHEMAS[command])
    else:
        with pytest.raises(ValueError, match=rf"^config key {key}(\[0\])?: "):
            check_config(cfg, SCHEMAS[command])
