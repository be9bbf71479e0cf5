"""A run killed after a checkpoint and resumed ends with the same weights as an uninterrupted run.

The kill is a real SIGKILL from outside (the training runs in a subprocess; the test watches for a
finished checkpoint under ``<output_dir>/checkpoints/`` and kills it then): nothing inside the trainer
knows it is being tested, and no log or file is flushed that a real kill would not flush.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dpr.training.train import train
from dpr.trainkit import checkpoint as ckpt
from dpr.trainkit.metrics_log import read_jsonl
from dpr.trainkit.seed import rng_state, set_rng_state

REPO = Path(__file__).resolve().parents[2]


def kill_after_first_checkpoint(cfg: dict, out: Path, timeout: float = 300.0) -> int:
    """Run ``train(cfg)`` in a subprocess and SIGKILL it as soon as a finished checkpoint exists in ``out``;
    returns the step of the checkpoints present after the kill (the newest)."""
    code = textwrap.dedent(f"""
        import json, sys, torch
        torch.set_num_threads(1)
        from dpr.training.train import train
        train(json.loads(sys.argv[1]))
        """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(cfg)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + timeout
    while not (out.exists() and ckpt.list_checkpoints(out)):
        if proc.poll() is not None:
            raise AssertionError(f"training ended (rc {proc.returncode}) before its first checkpoint: "
                                 f"{proc.stderr.read()[-2000:]}")
        assert time.monotonic() < end, "no checkpoint appeared"
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    return int(ckpt.list_checkpoints(out)[-1].name.split("_")[1])


# tiny models on a shared 2-core box: one intra-op thread (conftest.one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_cfg(model_dir: Path, data_dir: Path, out: Path, **train_kw) -> dict:
    return {
        "model": {"name": str(model_dir), "pooling": "mean", "question_max_length": 32, "passage_max_length": 64},
        "data": {"name": "tiny", "kind": "qa"},
        # batch 3 of 8 questions: epochs end mid-way through the data (2 batches, 2 left over),
        # H=2 draws top-up negatives from the seeded pool, warm-up and decay both matter
        "train": {"batch_size": 3, "hard_negatives": 2, "max_steps": 12, "save_every": 3, "lr": 1e-3,
                  "warmup_steps": 2, "print_every": 1000, "val_batch_size": 8, **train_kw},
        "logger": {"type": "none"},
        "data_dir": str(data_dir),
        "output_dir": str(out),
        "seed": 11,
    }


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=1e-6), k


@pytest.mark.slow
@pytest.mark.precision  # compares numbers under auto: runs under both rules in .ci/run
@pytest.mark.parametrize("precision", ["fp32", "auto"])
def test_killed_and_resumed_run_matches_uninterrupted(tiny_model_dir, tiny_data_dir, tmp_path, precision):
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    # dropout on (BERT's 0.1): the RNG state must come back too, not only weights and optimizer
    train(tiny_cfg(tiny_model_dir, tiny_data_dir, full, precision=precision))

    killed_at = kill_after_first_checkpoint(tiny_cfg(tiny_model_dir, tiny_data_dir, crashed, precision=precision),
                                            crashed)
    assert killed_at < 12 and not (crashed / "train_summary.json").exists()

    summary = train(tiny_cfg(tiny_model_dir, tiny_data_dir, crashed, precision=precision))  # resume=auto
    assert summary["steps"] == 12 and summary["resumed_from"].endswith(f"step_{killed_at}")

    _assert_same(_weights(full / "checkpoints" / "step_12" / "model.safetensors"),
                 _weights(crashed / "checkpoints" / "step_12" / "model.safetensors"))
    for tower in ("question_encoder", "passage_encoder"):
        _assert_same(_weights(full / tower / "model.safetensors"), _weights(crashed / tower / "model.safetensors"))
    # the metrics file holds each step once, with the same losses as the uninterrupted run
    la = [(r["step"], r["loss"]) for r in read_jsonl(full / "metrics.jsonl")]
    lb = [(r["step"], r["loss"]) for r in read_jsonl(crashed / "metrics.jsonl")]
    assert la == lb and [s for s, _ in la] == list(range(1, 13))
    assert read_jsonl(full / "validation.jsonl") == read_jsonl(crashed / "validation.jsonl")
    assert summary["best_step"] == train_best(full)


def train_best(out: Path) -> int:
    import json

    return json.loads((out / "train_summary.json").read_text())["best_step"]


def test_resume_false_restarts_and_resume_true_needs_a_checkpoint(tiny_model_dir, tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, resume=True, max_steps=1))
    train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=2, save_every=1, keep_checkpoints=1, validate=False))
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_2"]  # only the newest is kept
    # a finished run resumed with a larger budget continues from step 2
    s = train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=3, save_every=1, keep_checkpoints=1, validate=False))
    assert s["steps"] == 3 and [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    s = train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=1, resume=False, validate=False))
    assert s["steps"] == 1 and [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1]


def test_checkpoints_of_another_config_are_not_resumed(tiny_model_dir, tiny_data_dir, tmp_path):
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=2, save_every=1, validate=False))
    # another learning rate: the old steps are not this run's past, auto-resume starts over
    s = train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=1, lr=5e-4, save_every=1, validate=False))
    assert s["resumed_from"] is None and [p.name for p in ckpt.list_checkpoints(out)] == ["step_1"]
    with pytest.raises(ValueError, match="another model/data/train config"):
        train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=2, lr=1e-3, resume=True, validate=False))
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, resume=str(tmp_path / "nope")))
    # the same config resumes
    s = train(tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=2, lr=5e-4, save_every=1, validate=False))
    assert s["resumed_from"].endswith("step_1") and s["steps"] == 2


def test_checkpoint_round_trip_restores_rng_and_states(tmp_path):
    import random

    import numpy as np

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched.step()
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    state = rng_state()
    path = ckpt.save_checkpoint(tmp_path, 7, model, opt, sched, None, {"epoch": 1}, [state], keep=2)
    expected = (torch.rand(2), random.random(), np.random.rand())

    model2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (s + 1))
    saved, rngs = ckpt.load_checkpoint(path, model2, opt2, sched2)
    assert saved == {"epoch": 1, "step": 7}
    assert torch.equal(model.weight, model2.weight)
    assert sched2.get_last_lr() == sched.get_last_lr()
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    set_rng_state(rngs[0])
    got = (torch.rand(2), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]
    # a half-written checkpoint directory (no state.json) is never picked for resume
    (tmp_path / "checkpoints" / "step_9").mkdir()
    assert ckpt.latest_checkpoint(tmp_path) == path


@pytest.mark.slow
def test_loader_run_killed_and_resumed_equals_the_inline_run_bit_for_bit(tiny_model_dir, tiny_data_dir, tmp_path):
    """The background loader and the token cache (on by default) change nothing but the time: a run fed by them,
    SIGKILLed after a checkpoint and resumed, ends with exactly the weights and losses of an uninterrupted run whose
    batches are tokenised and built inline on the training thread (the data path before the loader existed)."""
    inline, crashed = tmp_path / "inline", tmp_path / "crashed"
    train(tiny_cfg(tiny_model_dir, tiny_data_dir, inline, precision="fp32", background_loader=False,
                   token_cache=False))
    loader = dict(precision="fp32", background_loader=True, token_cache=True)
    killed_at = kill_after_first_checkpoint(tiny_cfg(tiny_model_dir, tiny_data_dir, crashed, **loader), crashed)
    assert killed_at < 12 and not (crashed / "train_summary.json").exists()
    assert list((tiny_data_dir / "tiny" / "token_cache").glob("train.json.*/manifest.json"))  # the cache was made
    summary = train(tiny_cfg(tiny_model_dir, tiny_data_dir, crashed, **loader))
    assert summary["resumed_from"].endswith(f"step_{killed_at}")
    for tower in ("question_encoder", "passage_encoder"):
        a, b = _weights(inline / tower / "model.safetensors"), _weights(crashed / tower / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), tower
    assert [(r["step"], r["loss"]) for r in read_jsonl(inline / "metrics.jsonl")] == \
        [(r["step"], r["loss"]) for r in read_jsonl(crashed / "metrics.jsonl")]
