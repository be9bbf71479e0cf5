"""A run its checks refuse leaves its output directory exactly as it was: no Hydra log (``train.log``), no
``.hydra/``, no directory made for it. Hydra writes both before any code of the command runs; `dpr-train` stages
them outside the run directory until its checks pass (`dpr.cli.hydra_staging`). The other trainers (``dpr-rerank
train``, ``dpr-reader train``, ``dpr-pipeline``) log to the console only and run Hydra in the launch directory."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from dpr.cli import hydra_staging
from tests.conftest import directory_tree
from tests.run_command import refusal_line, run_command

USER_README = "# My notes\n\nexperiments I ran by hand\n"


def _conf(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True, exist_ok=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    return conf


def _args(cmd: list[str], model: Path, data_dir: Path, out: Path, conf: Path) -> list[str]:
    model_key = "model.name" if Path(cmd[0]).name in ("dpr-train", "dpr-pipeline") else "model"
    return [*cmd, "data=tiny", f"data_dir={data_dir}", f"output_dir={out}", f"{model_key}={model}",
            "--config-dir", str(conf)]


def _stages_left() -> list[str]:
    return [p for p in os.listdir(tempfile.gettempdir()) if p.startswith("dpr-train-hydra-")]


@pytest.fixture(autouse=True)
def own_tmp(tmp_path, monkeypatch):
    """A temporary directory of the test's own: staging directories of other processes never show in it."""
    private = tmp_path / "systmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))


@pytest.mark.parametrize("cmd", [["dpr-train"], ["dpr-rerank", "train"], ["dpr-reader", "train"], ["dpr-pipeline"]])
def test_a_refused_trainer_leaves_the_launch_and_output_directories_byte_for_byte(tiny_model_dir, tiny_data_dir,
                                                                                   tmp_path, cmd):
    out = tmp_path / "run"
    card = out / ("model/README.md" if cmd[0] == "dpr-pipeline" else "README.md")
    card.parent.mkdir(parents=True)
    card.write_text(USER_README)
    (out / "notes.txt").write_text("mine")
    conf = _conf(tmp_path)
    before, launch_before, stages_before = directory_tree(out), sorted(os.listdir(tmp_path)), _stages_left()
    proc = run_command(_args(cmd, tiny_model_dir, tiny_data_dir, out, conf), cwd=tmp_path)
    refusal_line(proc, f"{card}: looks like a text file, not a model card")
    assert directory_tree(out) == before  # before: dpr-train left train.log (and .hydra/ when killed) here
    assert sorted(os.listdir(tmp_path)) == launch_before and _stages_left() == stages_before


def test_dpr_train_refused_before_its_data_is_found_makes_no_directory(tiny_model_dir, tmp_path):
    out = tmp_path / "runs" / "new"
    (tmp_path / "runs").mkdir()
    proc = run_command(["dpr-train", f"model.name={tiny_model_dir}", f"output_dir={out}", "data=squad1_open",
                        f"data_dir={tmp_path / 'nodata'}", "train.max_steps=1"], cwd=tmp_path)
    refusal_line(proc, "no training data")
    assert not out.exists() and os.listdir(tmp_path / "runs") == []


def test_dpr_train_refuses_a_user_train_log(tiny_model_dir, tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "train.log").write_text("my own log of the day\n")
    before = directory_tree(out)
    proc = run_command(_args(["dpr-train"], tiny_model_dir, tiny_data_dir, out, _conf(tmp_path)), cwd=tmp_path)
    refusal_line(proc, f"{out / 'train.log'}: is not a log dpr-train wrote")
    assert directory_tree(out) == before


def test_dpr_train_log_and_hydra_dir_arrive_once_the_checks_pass(tiny_model_dir, tiny_data_dir, tmp_path):
    """A run that passes: its log (from its first line on) and .hydra/ are in the run directory; the same command
    again resumes into the same log (appended); other settings are refused with the finished run's files as
    they were, its train.log included."""
    out, stages = tmp_path / "run", _stages_left()
    args = _args(["dpr-train"], tiny_model_dir, tiny_data_dir, out, _conf(tmp_path))
    args += ["train.max_steps=2", "train.batch_size=4", "train.hard_negatives=1", "train.val_batch_size=8"]
    proc = run_command(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log1 = (out / "train.log").read_text()
    assert "run directory" in log1 and "done:" in log1
    assert (out / ".hydra" / "config.yaml").is_file() and not list(out.glob(".hydra.pending*"))
    assert _stages_left() == stages
    proc = run_command(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log2 = (out / "train.log").read_text()
    assert log2.startswith(log1) and log2.count("run directory") == 2
    before = directory_tree(out)
    proc = run_command(args + ["train.lr=5e-4"], cwd=tmp_path)
    refusal_line(proc, "train.lr")
    assert directory_tree(out) == before


def test_staging_is_kept_off_where_the_user_chose_hydras_placement(tmp_path):
    assert hydra_staging.applies(["output_dir=x"], [])
    assert hydra_staging.applies(["output_dir=x"], ["-m"])  # a sweep's job logs are staged too
    assert not hydra_staging.applies(["hydra.mode=MULTIRUN"], [])
    assert not hydra_staging.applies(["hydra/launcher=submitit_local"], ["-m"])  # its jobs: processes of their own
    assert not hydra_staging.applies(["+hydra.launcher.n_jobs=2"], ["--multirun"])
    assert hydra_staging.applies(["hydra/launcher=submitit_local"], [])  # a single run has no launcher
    assert not hydra_staging.applies(["hydra/job_logging=stdout"], [])
    assert not hydra_staging.applies(["hydra.output_subdir=null"], [])
    assert not hydra_staging.applies(["hydra.job_logging.root.level=DEBUG"], [])
    assert not hydra_staging.applies([], ["--config-name", "mine"])
    assert hydra_staging.applies([], ["--config-dir", str(tmp_path)])  # extra groups only: conf/train.yaml stays
    (tmp_path / "train.yaml").write_text("defaults:\n  - override hydra/job_logging: stdout\n")
    assert not hydra_staging.applies([], ["--config-dir", str(tmp_path)])  # the user's own train.yaml
    assert not hydra_staging.applies([], [f"--config-dir={tmp_path}"])


def test_cfg_job_shows_no_staging_directory(tmp_path):
    stages = _stages_left()
    proc = run_command(["dpr-train", "--cfg", "hydra"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "dpr-train-hydra-" not in proc.stdout and _stages_left() == stages


def test_a_real_process_refused_leaves_nothing(tiny_model_dir, tiny_data_dir, tmp_path):
    """The installed script in its own process (Hydra's logging set up as a user gets it)."""
    import sys

    out = tmp_path / "run"
    out.mkdir()
    (out / "README.md").write_text(USER_README)
    before = directory_tree(out)
    args = _args([str(Path(sys.executable).parent / "dpr-train")], tiny_model_dir, tiny_data_dir, out, _conf(tmp_path))
    env = dict(os.environ, WANDB_MODE="disabled", TMPDIR=tempfile.gettempdir())
    env.pop("RANK", None)
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "looks like a text file, not a model card" in proc.stderr, proc.stderr[-2000:]
    assert directory_tree(out) == before and _stages_left() == []


def test_a_killed_runs_staging_directory_is_removed_by_the_next_run(tmp_path):
    proc = subprocess.Popen(["true"])  # a process that has ended: its pid names no live process
    proc.wait()
    left = Path(tempfile.gettempdir()) / f"dpr-train-hydra-{proc.pid}-abc"
    (left / ".hydra").mkdir(parents=True)
    mine = Path(tempfile.gettempdir()) / f"dpr-train-hydra-{os.getpid()}-xyz"  # a live process's
    mine.mkdir()
    hydra_staging.stage_overrides(["output_dir=x"], [])
    hydra_staging.discard()
    assert not left.exists() and mine.is_dir() and _stages_left() == [mine.name]

