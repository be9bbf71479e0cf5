"""The run's seed comes from one place, `dpr.checks.SEED`: the commands' composed configs hold it, ``seed=<n>``
overrides it, and no YAML file restates its value."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from dpr.checks import SEED
from dpr.resources import CONF_DIR

COMMANDS = ("train", "pipeline")  # the commands whose root holds the run's seed


@pytest.fixture(scope="module", autouse=True)
def _registered():
    for name in COMMANDS:
        importlib.import_module(f"dpr.cli.{name}")  # registers the config groups, seed_cfg among them


def _compose(name: str, overrides: list[str]):
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose(name, overrides=overrides)


@pytest.mark.parametrize("name", COMMANDS)
def test_the_composed_seed_is_the_one_default(name):
    assert _compose(name, [])["seed"] == SEED


@pytest.mark.parametrize("name", COMMANDS)
def test_seed_is_overridden_as_typed(name):
    cfg = _compose(name, ["seed=7"])
    assert cfg["seed"] == 7
    assert list(cfg).count("seed") == 1


def test_the_schemas_default_is_the_same_seed():
    from dpr.cli.schemas import PipelineSchema, TrainCommandSchema

    assert TrainCommandSchema().seed == SEED and PipelineSchema().seed == SEED


def test_no_yaml_restates_the_seed():
    lines = [f"{p.name}:{n}" for p in sorted(Path(CONF_DIR).glob("*.yaml"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if re.match(rf"^seed:\s*{SEED}\b", line)]
    assert lines == []
