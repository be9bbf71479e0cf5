"""Issue 44: a training step makes no host synchronisation (a GPU's queue never drains between steps): the
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
