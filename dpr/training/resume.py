"""Which checkpoint is a retriever run's past: its fingerprint, and the checkpoint ``train.resume`` finds.

The checkpoint files themselves are the kit's (`dpr.trainkit.checkpoint`), shared with the reader and the
cross-encoder; what identifies a retriever run (model, data, seed, world size, the step-defining ``train``
settings) is here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from dpr.training.config import without_unset
from dpr.trainkit import checkpoint as ckpt

log = logging.getLogger(__name__)

# Settings that do not change what a step computes: a run may resume with other values (more steps, say).
RESUMABLE_KEYS = ckpt.RESUMABLE_KEYS | {
    "print_every", "eval_every", "validate", "best_metric",
    "optimizer_impl",  # AdamW's kernels: the same update up to rounding, as cpu_threads
}


def run_fingerprint(conf: Mapping[str, Any], train_cfg: Mapping[str, Any], train_path: Path, world: int) -> str:
    """What a checkpoint must have been trained with to be this run's past: model, data file, seed,
    world size and the step-defining train settings. Auto-resume ignores checkpoints that differ."""
    train = {k: v for k, v in train_cfg.items() if k not in RESUMABLE_KEYS and not k.startswith("val_")}
    train = without_unset(train)  # a key added later (train.attention_dropout) is recorded only when set
    return ckpt.fingerprint({"model": conf["model"], "data": conf["data"].get("name"), "seed": conf.get("seed"),
                             "train": train, "world_size": world, "train_file": ckpt.file_identity(train_path)})


def find_resume(resume: Any, out: Path, fingerprint: str) -> Path | None:
    """The checkpoint to resume from (:func:`dpr.trainkit.checkpoint.resolve_resume`), None to start over: one
    written with another config is ignored with a warning under ``train.resume=auto``, refused otherwise."""
    resume_dir = ckpt.resolve_resume(resume, out)
    if resume_dir is not None and ckpt.read_state(resume_dir).get("fingerprint") != fingerprint:
        if str(resume).lower() != "auto":
            raise ValueError(f"{resume_dir} was written with another model/data/train config; "
                             "train.resume=false starts over")
        log.warning("ignoring checkpoints in %s: written with another model/data/train config (starting over)", out)
        return None
    return resume_dir


__all__ = ["RESUMABLE_KEYS", "run_fingerprint", "find_resume"]
