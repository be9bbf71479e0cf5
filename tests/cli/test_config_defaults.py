"""One source of every default: each command's config, composed by Hydra from conf/ with no overrides, holds
exactly its dataclasses' defaults (the command schema of `dpr.cli.schemas`, `RerankCommandSchema`, `TrainConfig`,
`TeacherStageConfig`, `ReaderConfig`, and the shared BM25Config / BM25MiningConfig / RetrieveConfig / HybridConfig /
EvalConfig).
A value written in a YAML file that differs from its dataclass fails here, naming the command and the key.

Not compared: interpolations (``output_dir: runs/${data.name}`` composes other keys), MISSING (``???``) keys,
and the preset groups whose YAML options are the content (``data``: a dataset recipe, ``model``: an encoder
preset, ``index``: a FAISS recipe, ``loss``, ``logger``)."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import MISSING, OmegaConf

from dpr.bm25.config import BM25Config
from dpr.cli.schemas import SCHEMAS
from dpr.eval.config import BootstrapConfig, EvalConfig
from dpr.negatives.bm25_config import BM25MiningConfig
from dpr.negatives.config import RemineConfig
from dpr.reader.config import ReaderConfig
from dpr.rerank.config import RerankCommandSchema
from dpr.rerank.stage_config import TeacherStageConfig
from dpr.resources import CONF_DIR
from dpr.retrieval.config import RetrieveConfig
from dpr.retrieval.fusion import HybridConfig
from dpr.training.config import TrainConfig

for _mod in ("bm25", "data", "encode", "eval", "export", "index", "pipeline", "reader", "rerank", "retrieve", "train"):
    importlib.import_module(f"dpr.cli.{_mod}")  # each registers its ConfigStore nodes at import

PRESET_GROUPS = ("data", "model", "index", "loss", "logger", "hydra")


def _defaults(cls: type) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cls), resolve=False, throw_on_missing=False)


def _leaves(d, prefix=""):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], d


def _compose(name: str):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(name)
    return OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k not in PRESET_GROUPS]),
                                  resolve=False, throw_on_missing=False)


def _differences(composed: dict, expected: dict, where: str = "") -> list[str]:
    got = dict(_leaves(composed))
    bad = []
    for key, want in _leaves(expected):
        key = where + key
        if key.split(".")[0] in PRESET_GROUPS or want == MISSING or key not in got:
            continue
        value = got[key]
        if isinstance(value, str) and "${" in value:
            continue
        if value != want or isinstance(value, bool) != isinstance(want, bool):
            bad.append(f"{key}: composed {value!r}, dataclass default {want!r}")
    return bad


# (config file, the dataclasses whose defaults it must hold, where each lands: "" = the root)
CASES = {
    "bm25": [(SCHEMAS["bm25"], ""), (BM25Config, ""), (BM25MiningConfig, "")],
    "prepare": [(SCHEMAS["prepare"], "")],
    "encode": [(SCHEMAS["encode"], "")],
    "index": [(SCHEMAS["index"], "")],
    "retrieve": [(SCHEMAS["retrieve"], ""), (RetrieveConfig, ""), (HybridConfig, "")],
    "eval": [(SCHEMAS["eval"], ""), (EvalConfig, ""), (BootstrapConfig, "")],
    "train": [(SCHEMAS["train"], ""), (TrainConfig, "train."), (BM25Config, "bm25.")],
    "reader": [(SCHEMAS["reader"], ""), (ReaderConfig, "reader_cfg.")],
    "rerank": [(RerankCommandSchema, "")],
    "pipeline": [(SCHEMAS["pipeline"], ""), (BM25Config, "bm25."), (BM25MiningConfig, "bm25."),
                 (RetrieveConfig, "retrieve."), (HybridConfig, "hybrid."), (EvalConfig, "eval."),
                 (TeacherStageConfig, "teacher_cfg."), (RemineConfig, "remine."), (ReaderConfig, "reader_cfg.")],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_composed_config_is_the_dataclass_defaults(name):
    composed = _compose(name)
    bad = []
    for cls, where in CASES[name]:
        expected = _defaults(cls)
        if where:  # a section: compare its keys only
            expected = {where[:-1]: expected}
        bad += _differences(composed, expected)
    assert not bad, f"conf/{name}.yaml disagrees with its dataclasses: " + "; ".join(bad)


def test_shared_sections_are_one_dataclass():
    """The keys the shared dataclasses define are all there, where each command reads them."""
    pipe, bm25, ret, ev = _compose("pipeline"), _compose("bm25"), _compose("retrieve"), _compose("eval")
    for f in dataclasses.fields(BM25Config):
        assert pipe["bm25"][f.name] == bm25[f.name] == getattr(BM25Config(), f.name)
    for f in dataclasses.fields(HybridConfig):
        assert pipe["hybrid"][f.name] == ret[f.name] == getattr(HybridConfig(), f.name)
    for f in dataclasses.fields(EvalConfig):
        assert pipe["eval"][f.name] == ev[f.name] == getattr(EvalConfig(), f.name)
