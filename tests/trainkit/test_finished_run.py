"""``dpr-rerank train`` and ``dpr-reader train`` into a finished run of other settings are refused in one line (exit 2,
nothing on disk changed) unless ``overwrite=true``, as ``dpr-train`` is; the same settings finish or resume."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpr.trainkit.finished_run import check_finished_run
from tests.tiny_negatives import with_negatives
from tests.run_command import run_command

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # the console script of dpr.cli.<name> (dpr-<name>), its main in-process
    return run_command(["dpr-" + module.rsplit(".", 1)[1], *args], cwd=cwd, env={"HYDRA_FULL_ERROR": "0"})


def _refused_then_overwritten(module: str, common: list[str], other: str, run: Path, cwd: Path,
                              final: str) -> None:
    before = _tree(run)
    proc = _cli(module, *common, other, cwd=cwd)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and "holds a finished run trained with other settings" in lines[0], proc.stderr
    assert other.split("=")[0].split(".", 1)[1] in lines[0] and "overwrite=true" in lines[0]
    assert _tree(run) == before  # nothing changed on disk
    proc = _cli(module, *common, other, "overwrite=true", cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["resumed_from_step"] == 0 and (run / final).is_dir()


def test_dpr_rerank_train_refuses_a_finished_run_of_other_settings(tiny_model_dir, tiny_data_dir, tmp_path):
    from dpr.rerank.config import RerankConfig
    from dpr.rerank.train import train_cross_encoder

    train = with_negatives(tiny_data_dir, 2)
    run = tmp_path / "run"
    cfg = RerankConfig(model=str(tiny_model_dir), max_length=64)
    cfg.train.max_steps, cfg.train.batch_size, cfg.train.negatives, cfg.train.save_every = 2, 2, 2, 2
    cfg.train.precision = "fp32"
    train_cross_encoder(cfg, train, run)
    # the same settings (more steps are the same run): finished or resumed, never refused
    assert train_cross_encoder(cfg, train, run)["resumed_from_step"] == 2
    common = ["train", "data.name=tiny", f"data_dir={tiny_data_dir}", f"output_dir={run}", f"model={tiny_model_dir}",
              "rerank.max_length=64", "rerank.train.batch_size=2", "rerank.train.negatives=2",
              "rerank.train.max_steps=2", "rerank.train.save_every=2", "rerank.train.precision=fp32"]
    _refused_then_overwritten("dpr.cli.rerank", common, "rerank.train.lr=1e-3", run, tmp_path, "cross_encoder")


def test_dpr_reader_train_refuses_a_finished_run_of_other_settings(tiny_model_dir, tiny_data_dir, tmp_path):
    with_negatives(tiny_data_dir, 2)
    run = tmp_path / "run"
    common = ["train", "data.name=tiny", f"data_dir={tiny_data_dir}", f"output_dir={run}", f"model={tiny_model_dir}",
              "reader_cfg.max_length=64", "reader_cfg.train.batch_size=4", "reader_cfg.train.max_steps=2",
              "reader_cfg.train.save_every=2", "reader_cfg.train.precision=fp32"]
    proc = _cli("dpr.cli.reader", *common, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _refused_then_overwritten("dpr.cli.reader", common, "reader_cfg.train.lr=1e-3", run, tmp_path, "reader")


def test_a_summary_without_a_fingerprint_is_compared_by_the_fingerprint_of_its_config(tmp_path):
    (tmp_path / "train_summary.json").write_text(json.dumps({"config": {"train": {"lr": 1.0, "max_steps": 3}}}))
    fp = lambda c: json.dumps(c["train"]["lr"])  # noqa: E731 - a trainer's fingerprint of a config
    new = {"train": {"lr": 1.0, "max_steps": 9}}
    assert check_finished_run(tmp_path, "1.0", new, overwrite=False, outputs=(), fingerprint_of=fp) == "same"
    with pytest.raises(ValueError, match=r"train.lr: 1.0 -> 2.0\); train into a new output_dir="):
        check_finished_run(tmp_path, "2.0", {"train": {"lr": 2.0, "max_steps": 3}}, overwrite=False, outputs=(),
                           fingerprint_of=fp, ignored=("max_steps",))
    assert check_finished_run(tmp_path / "none", "x", new, overwrite=False, outputs=()) == "new"
    (tmp_path / "final").mkdir()
    assert check_finished_run(tmp_path, "2.0", new, overwrite=True, outputs=("final",), fingerprint_of=fp) == "overwritten"
    assert not (tmp_path / "train_summary.json").exists() and not (tmp_path / "final").exists()
