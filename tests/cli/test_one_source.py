"""One source of every default: each section a dataclass owns composes to exactly its defaults, so a value
written a second time (in a YAML file) cannot come back unnoticed."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import dpr.cli.bm25  # noqa: F401  each command's module registers the groups its config composes
import dpr.cli.encode  # noqa: F401
import dpr.cli.pipeline  # noqa: F401
import dpr.cli.retrieve  # noqa: F401
from dpr.bm25.config import BM25Config
from dpr.cli.common import CONF_DIR
from dpr.cli.schemas import EncodeSchema, PipelineEncode
from dpr.encode_config import PIPELINE_KEYS, EncodeConfig
from dpr.eval.config import EvalConfig
from dpr.negatives.config import RemineConfig
from dpr.retrieval.fusion import HybridConfig


def _compose(name: str) -> dict:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return OmegaConf.to_container(compose(config_name=name), resolve=True)


def _defaults(cls: type, keys=None) -> dict:
    d = dataclasses.asdict(cls())
    return d if keys is None else {k: d[k] for k in keys}


# (command, section: None = the root, dataclass, the keys it takes: None = every field)
CASES = [
    ("encode", None, EncodeConfig, None),
    ("pipeline", "encode", EncodeConfig, PIPELINE_KEYS),
    ("bm25", None, BM25Config, None),
    ("pipeline", "bm25", BM25Config, None),
    ("retrieve", None, HybridConfig, None),
    ("pipeline", "hybrid", HybridConfig, None),
    ("eval", None, EvalConfig, None),
    ("pipeline", "eval", EvalConfig, None),
    ("pipeline", "remine", RemineConfig, None),
]


@pytest.mark.parametrize("command,section,cls,keys", CASES, ids=[f"{c[0]}.{c[1] or 'root'}" for c in CASES])
def test_section_is_its_dataclass_defaults(command, section, cls, keys):
    cfg = _compose(command)
    node = cfg if section is None else cfg[section]
    want = _defaults(cls, keys)
    assert {k: node[k] for k in want} == want
    if section is not None and keys is not None:  # the section holds the listed keys and nothing of cls besides
        assert not (set(node) & {f.name for f in dataclasses.fields(cls)}) - set(keys)


def test_the_pipeline_encode_keys_are_exactly_its_stage_parameters():
    # the section is every encode stage's recorded parameters: a key added there re-runs cached encodes
    assert list(_compose("pipeline")["encode"]) == list(PIPELINE_KEYS)


def test_the_remine_section_is_exactly_remine_config():
    # the section is the remine_round<r> stages' recorded parameters: nothing else may land in it
    assert _compose("pipeline")["remine"] == _defaults(RemineConfig)


def test_no_yaml_restates_an_encode_default():
    # the values come from the group, not from conf/encode.yaml or conf/pipeline.yaml
    for name in ("encode", "pipeline"):
        text = open(f"{CONF_DIR}/{name}.yaml").read()
        for key in ("batch_size", "dtype", "quantize", "runtime", "chunk_size", "compile"):
            lines = [ln for ln in text.splitlines() if ln.strip().startswith(f"{key}:")]
            if name == "pipeline" and key == "batch_size":  # retrieve.batch_size: the question encoder's
                lines = lines[1:]
            assert not lines, (name, key, lines)


def test_schemas_take_their_defaults_from_the_dataclass():
    enc = _defaults(EncodeConfig)
    assert {k: v for k, v in _defaults(EncodeSchema).items() if k in enc} == enc
    assert _defaults(PipelineEncode) == {**_defaults(EncodeConfig, PIPELINE_KEYS), "max_length": None}


def test_a_changed_dataclass_default_reaches_every_command(monkeypatch):
    """The test above can fail: a default changed in the dataclass alone shows in both composed configs."""
    from dpr.encode_config import register_schema

    monkeypatch.setattr(EncodeConfig, "__init__", _with_batch(EncodeConfig.__init__, 7))
    register_schema()
    try:
        assert _compose("encode")["batch_size"] == 7
        assert _compose("pipeline")["encode"]["batch_size"] == 7
    finally:
        monkeypatch.undo()
        register_schema()
    assert _compose("encode")["batch_size"] == EncodeConfig().batch_size


def _with_batch(init, batch_size):
    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.batch_size = batch_size
    return patched
