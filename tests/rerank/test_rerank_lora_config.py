"""``rerank.model`` takes a plain name (as every command and config wrote it) or ``{name, lora}``: both spellings
compose, in any order, for ``dpr-rerank`` and the pipeline's teacher; without LoRA a rerank run and a pipeline
teacher stage recorded before keep their fingerprints (nothing re-runs)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from dpr.cli.argv import hydra_argv
from dpr.resources import CONF_DIR
from dpr.rerank.config import RerankConfig

for _mod in ("rerank", "pipeline"):
    importlib.import_module(f"dpr.cli.{_mod}")  # each registers its ConfigStore nodes at import

# Recorded on the code before rerank.model.lora (commit a7f7796): dpr.rerank.train._fingerprint of a config over a
# training file of fixed identity (what train_summary.json and the checkpoints hold), and dpr.stages.fingerprint of
# the teacher_train stage's params (what the pipeline's stage marker holds).
BEFORE = {
    "default": {"run": "abe1f5aaa03eeb96",
                "stage": "24d5d1639dd324681684b19ecc10670a3a56477b7b94a355454b8325c1b84776"},
    "named": {"run": "86d943e5c190caa6",
              "stage": "6eacb641f2e7583de616772a4782fa4c689d0316ac0ee635b8472108a0a99a7b"},
}
NAMED = {"model": "/models/ce-base", "max_length": 64, "train": {"max_steps": 7}}
# the composed pipeline's teacher stage: teacher=true (defaults), and a named base with 300 steps
BEFORE_COMPOSED = {"default": "24d5d1639dd324681684b19ecc10670a3a56477b7b94a355454b8325c1b84776",
                   "named": "2fd0cc1fa32a4ebe3ca3f36708f81c08fab8be595cf719350c7de836661453e7"}


def _training_file(tmp_path: Path) -> Path:
    f = tmp_path / "train.json"
    f.write_text('[{"question": "q"}]')
    os.utime(f, ns=(1_700_000_000_000_000_000,) * 2)
    return f


def _stage_fingerprint(rcfg: RerankConfig) -> str:
    from dpr.stages import fingerprint

    return fingerprint({"rerank": rcfg.as_dict()}, [])  # the teacher_train stage's params (dpr/rerank/pipeline.py)


def _compose(name: str, overrides: list[str], renames: dict | None = None):
    argv = hydra_argv(["prog", *overrides], renames=renames)[1:]  # as the command line reaches Hydra
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose(name, argv)


@pytest.mark.parametrize("label, d", [("default", {}), ("named", NAMED)])
def test_runs_and_teacher_stages_recorded_before_keep_their_fingerprints(label, d, tmp_path):
    from dpr.rerank.stage_config import TeacherStageConfig
    from dpr.rerank.train import _fingerprint

    cfg = RerankConfig.from_dict(d)
    assert isinstance(cfg.as_dict()["model"], str)  # recorded as the string it was
    assert _fingerprint(cfg, _training_file(tmp_path)) == BEFORE[label]["run"]
    assert _stage_fingerprint(TeacherStageConfig.from_dict({"rerank": d}).rerank) == BEFORE[label]["stage"]
    # the same through {name} and through Python's attribute
    as_mapping = {**d, "model": {"name": d.get("model", "all-MiniLM-L6-v2"), "lora": None}}
    assert _fingerprint(RerankConfig.from_dict(as_mapping), _training_file(tmp_path)) == BEFORE[label]["run"]
    # a summary recorded before (its config with the model as a string) is the same run: resumed, not refused
    assert _fingerprint(cfg.as_dict(), _training_file(tmp_path)) == BEFORE[label]["run"]


@pytest.mark.parametrize("label, overrides", [
    ("default", ["teacher=true"]),
    ("named", ["teacher=true", "teacher.rerank.model=/models/ce-base", "teacher.rerank.train.max_steps=300"]),
])
def test_the_composed_pipeline_teacher_stage_keeps_its_fingerprint(label, overrides):
    from dpr.cli.pipeline import teacher_overrides
    from dpr.rerank.pipeline import stage_config

    cfg = _compose("pipeline", teacher_overrides(["prog", *overrides])[1:])
    assert _stage_fingerprint(stage_config(cfg).rerank) == BEFORE_COMPOSED[label]


@pytest.mark.parametrize("overrides", [
    ["model=/models/base", "rerank.model.lora={r: 16}"],
    ["rerank.model.lora={r: 16}", "model=/models/base"],
    ["rerank.model=/models/base", "rerank.model.lora={r: 16}"],
    ["rerank.model.name=/models/base", "rerank.model.lora={r: 4}", "rerank.model.lora.r=16"],
    ["rerank.model={name: /models/base, lora: {r: 16}}"],
])
def test_both_spellings_compose_in_any_order(overrides):
    from dpr.rerank.train import as_config

    cfg = as_config(_compose("rerank", overrides, renames={"model": "rerank.model"}).rerank)  # dpr-rerank train's
    assert cfg.model.name == "/models/base" and cfg.model.lora.r == 16 and cfg.model.lora.alpha == 32.0
    assert cfg.as_dict()["model"] == {"name": "/models/base", "lora": {"r": 16, "alpha": 32.0, "dropout": 0.05,
                                                                       "target_modules": ["all-linear"]}}


def test_the_pipeline_teacher_takes_lora():
    from dpr.cli.pipeline import teacher_overrides
    from dpr.rerank.pipeline import stage_config

    argv = ["prog", "teacher=true", "teacher.rerank.model=/models/base", "teacher.rerank.model.lora={r: 8}"]
    tcfg = stage_config(_compose("pipeline", teacher_overrides(argv)[1:]))
    assert tcfg.rerank.model.name == "/models/base" and tcfg.rerank.model.lora.r == 8


@pytest.mark.parametrize("value, message", [
    ("{r: -1}", r"rerank.model.lora.r must be"),
    ("{rank: 4}", r"unknown rerank.model.lora config keys \['rank'\]"),
    ("{target_modules: []}", r"rerank.model.lora.target_modules must be a non-empty list"),
    ("16", r"rerank.model.lora must be a mapping"),
])
def test_bad_lora_settings_are_one_line_naming_the_key(value, message):
    from dpr.rerank.train import as_config

    cfg = _compose("rerank", [f"rerank.model.lora={value}"])
    with pytest.raises(ValueError, match=message) as err:
        as_config(cfg.rerank)
    assert "\n" not in str(err.value)
