"""A training step makes no host synchronisation (a GPU's queue never drains between steps): the
step's loss, statistics, gradient norm and finiteness stay on the device until a logging interval, a
validation or a checkpoint reads them.

On the CPU a sync costs nothing, so the test counts the calls that would sync on a GPU (``item``, ``float()``,
``int()``, ``bool()``, ``tolist``, numpy conversion) made by dpr's own code on the training thread inside the step
loop but outside the places allowed to read numbers (logging, validation, checkpoints, the divergence check they run
first), under the GPU policy (``length_bucket_size=0``: on the CPU's buckets each bucket's width is read).
Not ours and not counted: transformers' SDPA mask helper reads whether a batch has padding once per forward, and
AdamW's step counters are CPU tensors on every device. The frozen-index phase searches the corpus index on the
host by design (docs/results/gpu.md)."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from dpr.training.train import train
from tests.training.test_trainer import tiny_cfg

pytestmark = pytest.mark.usefixtures("one_thread")

# trim_padding reads the mask of CPU tensors only (test below): on the CPU that read costs nothing
ALLOWED = {"_log_step", "validate", "save_checkpoint", "flush_checks", "_ensure_corpus", "refresh_corpus",
           "trim_padding"}
SYNCS = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__", "__array__")


def _in_step_loop() -> str | None:
    """Where the caller sits, when it is dpr's code called from the step loop with no allowed frame in between."""
    f = sys._getframe(2)
    if "/dpr/" not in f.f_code.co_filename.replace("\\", "/"):
        return None
    below = None
    while f is not None:
        name = f.f_code.co_name
        if name in ALLOWED:
            return None
        if name == "_steps_of_epoch":
            return below
        below = below or f"{f.f_code.co_filename.rsplit('/', 2)[-1]}:{f.f_lineno} {name}"
        f = f.f_back
    return None


@pytest.mark.parametrize("overrides", [{}, {"grad_cache_chunk_size": 2}, {"grad_accumulation_steps": 2}])
def test_steps_between_logging_intervals_never_sync(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch, overrides):
    main = threading.main_thread()
    seen: list[str] = []
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _original=original, **k):
            if threading.current_thread() is main:
                where = _in_step_loop()
                if where:
                    seen.append(where)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    cfg = tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "run", max_steps=6, log_every=3, save_every=0,
                   eval_every=0, precision="fp32", length_bucket_size=0, **overrides)
    train(cfg)
    from collections import Counter
    assert not seen, f"{len(seen)} host syncs inside steps: {Counter(seen).most_common()}"


def test_trim_padding_never_reads_a_device_tensor():
    """On a device the padded columns stay (reading the mask would sync); a meta tensor cannot be read at all."""
    from dpr.models.length_buckets import trim_padding

    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    ids = torch.arange(8).reshape(2, 4)
    assert trim_padding({"input_ids": ids, "attention_mask": mask})["input_ids"].shape == (2, 2)  # CPU: trimmed
    on_device = trim_padding({"input_ids": ids.to("meta"), "attention_mask": mask.to("meta")})
    assert on_device["input_ids"].shape == (2, 4)


def _rows(out):
    import json

    skip = {"examples_per_s", "data_wait_ms"}  # timings
    return [{k: v for k, v in json.loads(line).items() if k not in skip}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_lagged_logging_writes_the_same_rows_one_interval_late(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """On a CUDA device a logging interval writes the rows of the steps before it (the step just queued is read at
    the next one): the same rows, the same weights, and never a row of the step being logged but the last."""
    from safetensors.torch import load_file

    from dpr.training import trainer as trainer_mod

    cfg = lambda out: tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=7, log_every=1,  # noqa: E731
                               save_every=0, eval_every=0, precision="fp32")
    train(cfg(tmp_path / "now"))
    written: list[tuple[int, int]] = []
    original = trainer_mod.Trainer._write_row

    def spy(self, args, *a, **k):
        written.append((self.state.step, args[0]))
        return original(self, args, *a, **k)

    monkeypatch.setattr(trainer_mod, "lagged_logging", lambda device: True)
    monkeypatch.setattr(trainer_mod.Trainer, "_write_row", spy)
    train(cfg(tmp_path / "lagged"))
    assert _rows(tmp_path / "lagged") == _rows(tmp_path / "now")
    # (step being run, row written): the tiny set's epoch is 2 steps and each epoch's validation writes every
    # row first; the others wait one step; the last step's at once
    assert written == [(2, 1), (2, 2), (4, 3), (4, 4), (6, 5), (6, 6), (7, 7)]
    for name in ("question_encoder", "passage_encoder"):
        a = load_file(tmp_path / "now" / name / "model.safetensors")
        b = load_file(tmp_path / "lagged" / name / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_lagging_only_on_a_cuda_device():
    from dpr.training.trainer import lagged_logging

    assert lagged_logging(torch.device("cuda", 1)) and lagged_logging("cuda")
    assert not lagged_logging(torch.device("cpu")) and not lagged_logging("meta")


def test_staged_figures_are_the_steps_means_and_copies():
    """`stage` reduces a step's micro-batch figures the way metrics.jsonl reports them and hands back host copies
    (on CUDA: non-blocking, behind an event), so the device tensors may be reused or freed after it."""
    from dpr.losses.base import LossOutput
    from dpr.training.step_figures import stage

    outs = [LossOutput(loss=torch.tensor(1.0), accuracy=torch.tensor(0.5), avg_rank=torch.tensor(2.0),
                       num_candidates=8, masked=torch.tensor(3)),
            LossOutput(loss=torch.tensor(3.0), accuracy=1.0, avg_rank=torch.tensor(0.0), num_candidates=8, masked=1)]
    losses, accs = torch.tensor([1.0, 3.0]), torch.tensor([0.5, 1.0])
    grad_norm = torch.tensor(0.25)
    staged = stage([(4, 1e-3, grad_norm, losses, accs)], [(4, outs, 1e-3, grad_norm)]).wait()
    step, lr, loss_sum, mean_loss, accuracy, norm = staged.checks[0]
    assert (step, lr) == (4, 1e-3) and float(loss_sum) == 4.0 and float(mean_loss) == 2.0
    assert float(accuracy) == 0.75 and float(norm) == 0.25
    (_, figures, row_norm), = staged.rows
    assert figures.tolist() == [2.0, 0.75, 1.0, 2.0] and float(row_norm) == 0.25  # loss, accuracy, rank, masked
    losses.mul_(0)
    grad_norm.fill_(9.0)  # the device's tensors change: the staged figures do not
    assert float(staged.checks[0][2]) == 4.0 and float(staged.rows[0][2]) == 0.25
    assert stage([], []).checks == [] and stage([], []).event is None
