"""Which checkpoint is a retriever run's past: its fingerprint, and the checkpoint ``train.resume`` finds.

The checkpoint files themselves are the kit's (`dpr.trainkit.checkpoint`), shared with the reader and the
cross-encoder; what identifies a retriever run (model, data, seed, world size, the step-defining ``train``
settings) is here.

A LoRA run's checkpoints hold its adapters alone: they mean something only on the base they were trained on.
``.lora_base.json`` in the run directory records that base's fingerprint (`dpr.models.lora.base_fingerprint`), and a resume
onto another base (the files at ``model.name`` replaced) is refused in one line (`check_lora_base`), where it would
otherwise go on training the old adapters on the new base and save them as the new base's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable, Mapping

from dpr.atomic import write_json_atomic
from dpr.models.run_format import CONFIG_FILE
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


def find_resume(resume: Any, out: Path, fingerprint: str, lora_base: str | None = None) -> Path | None:
    """The checkpoint to resume from (:func:`dpr.trainkit.checkpoint.resolve_resume`), None to start over: one
    written with another config is ignored with a warning under ``train.resume=auto``, refused otherwise.
    ``lora_base``: the LoRA base's fingerprint (:func:`lora_base_fingerprint`), checked by `check_lora_base`."""
    resume_dir = ckpt.resolve_resume(resume, out)
    if resume_dir is not None and ckpt.read_state(resume_dir).get("fingerprint") != fingerprint:
        if str(resume).lower() != "auto":
            raise ValueError(f"{resume_dir} was written with another model/data/train config; "
                             "train.resume=false starts over")
        log.warning("ignoring checkpoints in %s: written with another model/data/train config (starting over)", out)
        resume_dir = None
    check_lora_base(out, lora_base, resume_dir, markers=[Path(out) / CONFIG_FILE])
    return resume_dir


BASE_FILE = ".lora_base.json"  # beside checkpoints/, which a fresh run empties after this check


def lora_base_fingerprint(name: str, lora: Any) -> str | None:
    """The fingerprint of the base model ``name`` names when ``lora`` is set (None without LoRA, or for a hub name
    that is not a local directory: nothing to compare)."""
    if not lora:
        return None
    from dpr.models.hub import resolve_model_name
    from dpr.models.lora import base_fingerprint

    return base_fingerprint(resolve_model_name(name))


def _recorded_base(paths: Iterable[Path]) -> tuple[Path, str] | None:
    for path in paths:
        try:
            value = json.loads(path.read_text(encoding="utf-8")).get("base_fingerprint")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, str):
            return path, value
    return None


def check_lora_base(out: Path, base: str | None, resume_dir: Path | None, markers: Iterable[Path] = ()) -> None:
    """Refuse (ValueError, one line) to resume ``resume_dir``'s adapters on a base other than the one they were
    trained on (recorded in the run directory's :data:`BASE_FILE`, else in ``markers``: the finished run's model
    marker); then record ``base`` for this run's checkpoints. Nothing without LoRA (``base`` None)."""
    if base is None:
        return
    out = Path(out)
    if resume_dir is not None:
        found = _recorded_base([Path(resume_dir).parent.parent / BASE_FILE, *markers])
        if found is not None and found[1] != base:
            raise ValueError(f"{resume_dir}: its LoRA adapters were trained on another base model (fingerprint "
                             f"{found[1][:12]} in {found[0].name}, the base now at model.name is {base[:12]}): put "
                             "the original base back, train.resume=false to start over, or train into a new "
                             "output_dir=")
    write_json_atomic(out / BASE_FILE, {"base_fingerprint": base})


__all__ = ["RESUMABLE_KEYS", "run_fingerprint", "find_resume", "check_lora_base", "lora_base_fingerprint"]
