"""``teacher_cfg.loss=<name>`` finds ``loss/<name>.yaml`` where ``loss=<name>`` does: in the package's conf/ and in a
user's ``--config-dir`` (Hydra's config search path), not in the package's conf/ alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from tests.run_command import run_as_subprocess

REPO = Path(__file__).resolve().parents[2]


def _user_conf(root: Path) -> Path:
    """A --config-dir with two losses of the user's: a distillation loss (teacher temperature 2) and a plain one."""
    (root / "loss").mkdir(parents=True)
    kl = (REPO / "conf" / "loss" / "kl_distill.yaml").read_text().replace("teacher_temperature: 1.0",
                                                                          "teacher_temperature: 2.0")
    assert "teacher_temperature: 2.0" in kl
    (root / "loss" / "my_kl.yaml").write_text(kl)
    (root / "loss" / "my_nll.yaml").write_text((REPO / "conf" / "loss" / "softmax_nll.yaml").read_text())
    return root


def _pipeline(conf: Path, tmp_path: Path, loss: str) -> subprocess.CompletedProcess:
    (tmp_path / "empty").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "0"}
    return run_as_subprocess([sys.executable, "-m", "dpr.cli.pipeline", "--config-dir", str(conf), "data.name=tiny",
                              "data.kind=qa", "data.recipe=none", f"data_dir={tmp_path / 'empty'}",
                              f"output_dir={tmp_path / 'run'}", "teacher=true", f"teacher_cfg.loss={loss}"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_loss_in_the_users_config_dir_is_found_by_teacher_cfg_loss(tmp_path):
    conf = _user_conf(tmp_path / "conf")
    # found, then judged: a loss without a teacher is refused for what it is (was: "no conf/loss/my_nll.yaml")
    proc = _pipeline(conf, tmp_path, "my_nll")
    assert proc.returncode == 2 and "teacher_cfg.loss='my_nll' does not learn from a teacher's scores" in proc.stderr
    # found and accepted: the run goes on to its data (here: none prepared)
    proc = _pipeline(conf, tmp_path, "my_kl")
    assert proc.returncode == 2 and "teacher_cfg" not in proc.stderr and "expects a prepared dataset" in proc.stderr
    # a name found nowhere names every place looked in
    proc = _pipeline(conf, tmp_path, "nowhere")
    assert proc.returncode == 2 and f"{conf / 'loss'}" in proc.stderr and "my_kl" in proc.stderr


def test_the_distilled_training_reads_the_users_loss(tmp_path, monkeypatch):
    import dpr.rerank.pipeline as rp
    from dpr.resources import conf_dir
    from dpr.rerank.stage_config import TeacherStageConfig

    conf = _user_conf(tmp_path / "conf")
    monkeypatch.setattr(rp, "config_dirs", lambda: [conf_dir(), conf])  # what Hydra's search path gives
    cfg = OmegaConf.create({"loss": {}, "train": {"teacher_scores": ""}})
    new = rp.distill_config(cfg, TeacherStageConfig(loss="my_kl"), tmp_path / "s.jsonl")
    assert new.loss.teacher_temperature == 2.0 and new.loss.nll_weight == 1.0  # the file, then loss_args
    with pytest.raises(ValueError, match="my_nll' does not learn"):
        rp.distill_config(cfg, TeacherStageConfig(loss="my_nll"), tmp_path / "s.jsonl")
