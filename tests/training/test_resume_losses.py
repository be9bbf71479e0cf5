"""Kill -9 and resume equals an uninterrupted run for a non-default recipe: the hinge loss, a frozen-index
phase, then two-tower steps with cached corpus negatives (the cache travels in the checkpoints); and the
same for the distillation losses, their teacher's scores read from a scores file (in-batch and corpus pools)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.conftest import write_tiny_teacher_scores
from safetensors.torch import load_file

from dpr.trainkit.metrics_log import read_jsonl

RUNNER = "import json, sys; from dpr.training.train import train; train(json.load(open(sys.argv[1])))"


LOSSES = {"hinge": {"_target_": "dpr.losses.HingeLoss", "margin": 0.5},
          "kl_distill": {"_target_": "dpr.losses.KLDistillLoss", "nll_weight": 0.5, "teacher_temperature": 2.0},
          "margin_mse": {"_target_": "dpr.losses.MarginMSELoss", "teacher_scale": 0.5}}


def cfg(model_dir: Path, data_dir: Path, out: Path, loss: str = "hinge") -> dict:
    return {
        "model": {"name": str(model_dir), "shared": False, "pooling": "mean", "question_max_length": 32,
                  "passage_max_length": 64},
        "data": {"name": "tiny", "kind": "qa"},
        "loss": LOSSES[loss],
        "train": {"batch_size": 3, "hard_negatives": 1, "frozen_steps": 4, "max_steps": 10, "save_every": 2,
                  "keep_checkpoints": 2, "corpus_negatives": True, "corpus_refresh_every": 5, "lr": 1e-3,
                  "warmup_steps": 2, "print_every": 1000, "val_batch_size": 8, "eval_every": 6, "precision": "fp32"},
        "logger": {"type": "none"},
        "data_dir": str(data_dir),
        "output_dir": str(out),
        "seed": 3,
    }


def _run(conf: dict, tmp: Path, kill_after_checkpoint: int | None = None) -> int:
    """Train ``conf`` to its end in this process (one thread, fp32 matmuls, as the killed process runs), or as a
    process SIGKILLed once checkpoint ``kill_after_checkpoint`` is on disk: only the kill needs a process."""
    if kill_after_checkpoint is None:
        from dpr.training.train import train

        threads, matmul = torch.get_num_threads(), torch.get_float32_matmul_precision()
        torch.set_num_threads(1)
        torch.set_float32_matmul_precision("highest")
        try:
            train(json.loads(json.dumps(conf)))
        finally:
            torch.set_num_threads(threads)
            torch.set_float32_matmul_precision(matmul)
        return 0
    path = tmp / f"cfg_{Path(conf['output_dir']).name}.json"
    path.write_text(json.dumps(conf))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(path)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    target = Path(conf["output_dir"]) / "checkpoints" / f"step_{kill_after_checkpoint}" / "state.json"
    deadline = time.time() + 600
    while not target.is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)  # from outside, mid-run: no handler runs, nothing is flushed
    proc.communicate(timeout=60)
    return proc.returncode


@pytest.mark.slow
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_sigkill_and_resume_matches_uninterrupted_for_frozen_and_corpus(tiny_model_dir, tiny_data_dir, tmp_path, loss):
    if loss != "hinge":
        write_tiny_teacher_scores(tiny_data_dir / "tiny")  # hard negatives + an overlap teacher's scores
    full, killed = tmp_path / "full", tmp_path / "killed"
    _run(cfg(tiny_model_dir, tiny_data_dir, full, loss), tmp_path)
    rc = _run(cfg(tiny_model_dir, tiny_data_dir, killed, loss), tmp_path, kill_after_checkpoint=6)
    assert rc == -signal.SIGKILL
    assert not (killed / "train_summary.json").exists()  # really killed before the end
    _run(cfg(tiny_model_dir, tiny_data_dir, killed, loss), tmp_path)  # resume=auto
    for tower in ("question_encoder", "passage_encoder"):
        a = load_file(str(full / tower / "model.safetensors"))
        b = load_file(str(killed / tower / "model.safetensors"))
        assert a.keys() == b.keys()
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=0, atol=1e-6), k
    la = [(r["step"], r["loss"], r["frozen"]) for r in read_jsonl(full / "metrics.jsonl")]
    lb = [(r["step"], r["loss"], r["frozen"]) for r in read_jsonl(killed / "metrics.jsonl")]
    assert la == lb and [s for s, _, _ in la] == list(range(1, 15))
    assert [f for _, _, f in la] == [True] * 4 + [False] * 10
    summary = json.loads((killed / "train_summary.json").read_text())
    assert summary["resumed_from"] is not None
