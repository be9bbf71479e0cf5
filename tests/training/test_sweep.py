"""Sweeps: `dpr-train -m` writes one directory per run and one summary table at the sweep directory."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from dpr.cli.train import sweep_subdir
from dpr.trainkit.metrics_log import read_jsonl
from dpr.training.sweep import write_sweep_summary
from tests.run_command import run_as_subprocess


def _dpr_train() -> list[str]:
    script = Path(sys.executable).parent / "dpr-train"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "dpr.cli.train"]


def _tiny_sweep(tiny_model_dir, tiny_data_dir, tmp_path, *overrides: str) -> Path:
    """``dpr-train -m`` on the tiny data and model; returns the sweep directory."""
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    sweep = tmp_path / "sweep"
    cmd = [*_dpr_train(), "-m", "--config-dir", str(conf), "data=tiny", f"data_dir={tiny_data_dir}",
           f"output_dir={sweep}", "model=tiny", f"model.name={tiny_model_dir}", "train.max_steps=2",
           "train.batch_size=4", "train.val_batch_size=8", *overrides]
    env = dict(os.environ, WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", HYDRA_FULL_ERROR="1",
               OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    proc = run_as_subprocess(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep


def test_multirun_writes_run_dirs_and_summary(tiny_model_dir, tiny_data_dir, tmp_path):
    sweep = _tiny_sweep(tiny_model_dir, tiny_data_dir, tmp_path, "train.lr=1e-3,1e-4")

    runs = sorted(p.parent for p in sweep.glob("*/train_summary.json"))
    assert len(runs) == 2
    assert [r.name for r in runs] == ["0_train.lr=0.001", "1_train.lr=0.0001"]  # Hydra normalises the values
    for run in runs:  # each run its own metrics and model
        assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2]
        assert (run / "question_encoder" / "config.json").is_file()
        assert (run / ".hydra" / "overrides.yaml").is_file()

    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert summary["num_runs"] == 2
    assert [r["overrides"]["train.lr"] for r in summary["runs"]] == ["0.001", "0.0001"]
    losses = [r["metrics"]["loss"] for r in summary["runs"]]
    assert losses[0] != losses[1]  # the lr really differed between the runs
    md = (sweep / "sweep_summary.md").read_text()
    assert "| run | train.lr |" in md and md.count("\n| 0_") == 1 and md.count("\n| 1_") == 1
    rows = list(csv.DictReader(open(sweep / "sweep_summary.csv")))
    assert [r["train.lr"] for r in rows] == ["0.001", "0.0001"] and "val_avg_rank" in rows[0]


def test_summary_table_from_run_dirs(tmp_path):
    for i, (lr, loss) in enumerate([("1e-5", 0.5), ("3e-5", 0.25)]):
        d = tmp_path / f"{i}_train.lr={lr}"
        d.mkdir()
        (d / "train_summary.json").write_text(json.dumps({
            "overrides": [f"train.lr={lr}", "data=squad1_open"], "job_num": i, "steps": 10, "best_step": 10,
            "wall_time_s": 1.0, "final_metrics": {"loss": loss, "val_top20": 0.5 + i / 10},
        }))
    (tmp_path / "unfinished").mkdir()  # a run that died has no summary and is not a row
    payload = write_sweep_summary(tmp_path)
    assert [r["run"] for r in payload["runs"]] == ["0_train.lr=1e-5", "1_train.lr=3e-5"]
    md = (tmp_path / "sweep_summary.md").read_text().splitlines()
    # the swept key comes first, constant overrides after it
    assert md[4] == "| run | train.lr | data | loss | val_top20 | best_step | steps | wall_time_s |"
    assert md[6].startswith("| 0_train.lr=1e-5 | 1e-5 | squad1_open | 0.5 | 0.5 |")


def test_sweep_subdir_names_the_swept_keys_in_one_safe_path_component():
    argv = ["dpr-train", "-m", "model.name=/tmp/x y/bert", "train.lr=1e-5,3e-5", "train.hard_negatives=range(0,2)",
            "train.val_topk=[1,5]"]
    dirname = "model.name=/tmp/x y/bert,train.hard_negatives=1,train.lr=3e-05,train.val_topk=[1,5]"
    assert sweep_subdir(3, dirname, argv) == "3_train.hard_negatives=1,train.lr=3e-05"
    # nothing recognisably swept: the whole override list, made safe
    assert sweep_subdir(3, "model.name=/tmp/x y/bert", ["dpr-train"]) == "3_model.name=_tmp_x_y_bert"
    assert sweep_subdir(0, "", ["dpr-train"]) == "0"
    assert len(sweep_subdir(12, "a=" + "b" * 500, ["dpr-train"])) <= 3 + 120


def test_sweep_over_two_losses_writes_two_runs_and_one_summary(tiny_model_dir, tiny_data_dir, tmp_path):
    sweep = _tiny_sweep(tiny_model_dir, tiny_data_dir, tmp_path, "train.save_every=0", "loss=softmax_nll,hinge")
    runs = sorted(p.parent for p in sweep.glob("*/train_summary.json"))
    assert [r.name for r in runs] == ["0_loss=softmax_nll", "1_loss=hinge"]
    targets = [json.loads((r / "train_summary.json").read_text())["config"]["loss"]["_target_"] for r in runs]
    assert targets == ["dpr.losses.SoftmaxNLLLoss", "dpr.losses.HingeLoss"]
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert summary["num_runs"] == 2 and [r["overrides"]["loss"] for r in summary["runs"]] == ["softmax_nll", "hinge"]
    losses = [r["metrics"]["loss"] for r in summary["runs"]]
    assert losses[0] != losses[1]
