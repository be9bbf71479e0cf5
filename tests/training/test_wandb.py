"""wandb logging runs offline: no network, no API key, the run lands in <output_dir>/wandb/."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dpr.trainkit.metrics_log import MetricsLogger, read_jsonl
from dpr.training.train import train


# tiny models on a shared 2-core box: one intra-op thread (conftest.one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


def test_wandb_offline_run_without_key(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))  # no reads of ~/.config/wandb
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
    out = tmp_path / "run"
    cfg = {
        "model": {"name": str(tiny_model_dir), "pooling": "mean", "question_max_length": 32, "passage_max_length": 64},
        "data": {"name": "tiny", "kind": "qa"},
        "train": {"batch_size": 4, "hard_negatives": 1, "max_steps": 2, "lr": 1e-3, "val_batch_size": 8},
        "logger": {"type": "wandb", "project": "dpr-test", "name": "tiny", "tags": ["test"]},
        "data_dir": str(tiny_data_dir),
        "output_dir": str(out),
        "seed": 3,
    }
    train(cfg)
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("run-*.wandb")), list(runs[0].iterdir())  # the offline event log
    run_id = (out / "wandb_run_id.txt").read_text().strip()
    assert runs[0].name.endswith(run_id)
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]  # the file logger still writes


def test_logger_none_writes_no_wandb_and_disabled_logger_writes_nothing(tmp_path):
    log = MetricsLogger(tmp_path / "a", wandb_cfg=None)
    log.log_train(1, {"loss": torch.tensor(0.5)})
    log.log_validation(1, {"avg_rank": 2.0})
    log.close()
    assert read_jsonl(tmp_path / "a" / "metrics.jsonl") == [{"step": 1, "loss": 0.5}]
    assert read_jsonl(tmp_path / "a" / "validation.jsonl") == [{"step": 1, "avg_rank": 2.0}]
    assert not (tmp_path / "a" / "wandb").exists()
    quiet = MetricsLogger(tmp_path / "b", enabled=False)  # ranks other than 0
    quiet.log_train(1, {"loss": 1.0})
    quiet.close()
    assert not Path(tmp_path / "b").exists()
