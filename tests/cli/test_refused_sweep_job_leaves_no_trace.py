"""A job of a ``dpr-train -m`` sweep that its checks refuse leaves no trace either: no ``train.log`` and no
directory made for it, and a sweep refused before any job ran leaves no ``multirun.yaml`` and no sweep directory
(`dpr.cli.hydra_staging`). A job that passes writes what it always wrote."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.conftest import directory_tree
from tests.run_command import refusal_line, run_command

ZERO_STEPS = "zero training steps"


@pytest.fixture(autouse=True)
def own_tmp(tmp_path, monkeypatch):
    """A temporary directory of the test's own: staging directories of other processes never show in it."""
    private = tmp_path / "systmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))


def _stages_left() -> list[str]:
    return [p for p in os.listdir(tempfile.gettempdir()) if p.startswith("dpr-train-hydra-")]


def _sweep(tmp_path: Path, model: Path, data_dir: Path, sweep: Path, *overrides: str):
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True, exist_ok=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    return run_command(["dpr-train", "-m", "--config-dir", str(conf), "data=tiny", f"data_dir={data_dir}",
                        f"output_dir={sweep}", f"model.name={model}", "train.batch_size=4", "train.hard_negatives=1",
                        "train.val_batch_size=8", "train.epochs=0", *overrides], cwd=tmp_path)


def test_a_refused_job_after_a_good_one_leaves_no_log_and_no_directory(tiny_model_dir, tiny_data_dir, tmp_path):
    sweep = tmp_path / "sweep"
    proc = _sweep(tmp_path, tiny_model_dir, tiny_data_dir, sweep, "train.max_steps=2,0")
    refusal_line(proc, ZERO_STEPS)
    good = sweep / "0_train.max_steps=2"
    assert sorted(p.name for p in sweep.iterdir()) == [good.name, "multirun.yaml"]  # no 1_train.max_steps=0/
    log = (good / "train.log").read_text()
    assert "run directory" in log and "done:" in log  # the good job's log, from its first line on
    assert (good / ".hydra" / "config.yaml").is_file() and not list(good.glob(".hydra.pending*"))
    assert (good / "train_summary.json").is_file() and _stages_left() == []


def test_a_sweep_refused_at_its_first_job_makes_no_directory(tiny_model_dir, tiny_data_dir, tmp_path):
    sweep = tmp_path / "runs" / "sweep"
    (tmp_path / "runs").mkdir()
    proc = _sweep(tmp_path, tiny_model_dir, tiny_data_dir, sweep, "train.max_steps=0,2")
    refusal_line(proc, ZERO_STEPS)
    assert os.listdir(tmp_path / "runs") == [] and _stages_left() == []


def test_a_refused_sweep_leaves_an_existing_sweep_directory_byte_for_byte(tiny_model_dir, tiny_data_dir, tmp_path):
    """The user's files, an earlier sweep's multirun.yaml (Hydra writes over it) and an empty directory of the
    refused job's name stay as they were."""
    sweep = tmp_path / "sweep"
    (sweep / "0_train.max_steps=0").mkdir(parents=True)
    (sweep / "notes.txt").write_text("mine")
    (sweep / "multirun.yaml").write_text("hydra:\n  mode: MULTIRUN\n# an earlier sweep's\n")
    before = directory_tree(sweep)
    proc = _sweep(tmp_path, tiny_model_dir, tiny_data_dir, sweep, "train.max_steps=0,2")
    refusal_line(proc, ZERO_STEPS)
    assert directory_tree(sweep) == before and _stages_left() == []
