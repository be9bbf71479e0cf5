"""Each setting is declared once, on its dataclass field: the allowed values of every numeric key sit on the field
(`dpr.config.setting`), and no second table of ranges exists beside the dataclasses to fall out of step."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from dpr.config import check_fields, field_rules, numeric_fields, setting, Int
from dpr.models.biencoder import BiEncoderConfig
from dpr.models.lora import LoraSettings
from dpr.negatives.config import RemineConfig
from dpr.rerank.config import RerankConfig, RerankScoreConfig, RerankTrainConfig
from dpr.rerank.stage_config import TeacherStageConfig
from dpr.training.config import TrainConfig

PACKAGE = Path(__file__).resolve().parents[1] / "dpr"
DECLARED = [TrainConfig, BiEncoderConfig, LoraSettings, RemineConfig, RerankConfig, RerankTrainConfig, RerankScoreConfig,
            TeacherStageConfig]


@pytest.mark.parametrize("cls", DECLARED, ids=lambda c: c.__name__)
def test_every_numeric_field_declares_its_range(cls):
    assert sorted(numeric_fields(cls)) == sorted(field_rules(cls))


def test_no_table_of_ranges_beside_the_dataclasses():
    tables = [f"{p.relative_to(PACKAGE.parent)}:{n}" for p in sorted(PACKAGE.rglob("*.py"))
              for n, line in enumerate(p.read_text().splitlines(), 1)
              if re.match(r"^[A-Z_]+_RANGES\s*[:=]", line)]
    assert tables == []


def test_a_declared_rule_is_checked_in_one_line():
    @dataclasses.dataclass
    class Demo:
        size: int = setting(4, Int(1, 8))
        names: list = setting(rule=None, factory=list)

    check_fields(Demo(), "demo")
    with pytest.raises(ValueError, match=r"^demo\.size must be an integer in \[1, 8\], got 9$"):
        check_fields(Demo(size=9), "demo")
    assert Demo().names == [] and Demo().names is not Demo().names


@pytest.mark.parametrize("cls,label,key,value", [
    (LoraSettings, "model.lora", "r", -1),
    (RemineConfig, "remine", "bm25_share", 1.5),
    (RerankScoreConfig, "rerank.score", "k", 0),
])
def test_the_commands_messages_are_unchanged(cls, label, key, value):
    obj = cls()
    setattr(obj, key, value)
    with pytest.raises(ValueError, match=rf"^{re.escape(label)}\.{key} must be "):
        check_fields(obj, label)


def test_model_presets_state_only_what_differs_from_the_defaults():
    """Each conf/model preset extends BiEncoderConfig's defaults (``model_base``) and states its name and the keys it
    changes, nothing more: a default restated in eight files is eight places to forget when it changes."""
    import yaml

    defaults = dataclasses.asdict(BiEncoderConfig())
    presets = sorted((PACKAGE.parent / "conf" / "model").glob("*.yaml"))
    assert presets
    for path in presets:
        data = yaml.safe_load(path.read_text())
        assert data["defaults"] == [{"/model_base@_here_": "default"}, "_self_"], path.name
        restated = sorted(k for k, v in data.items() if k not in ("defaults", "name") and v == defaults[k])
        assert restated == [], f"{path.name} restates defaults {restated}"
