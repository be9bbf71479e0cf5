"""Resumable checkpoints: weights (safetensors), optimizer, scheduler, scaler, RNG states, data position --
the one format of the retriever's, the reader's and the cross-encoder's checkpoints.

Layout of ``<output_dir>/checkpoints/step_<n>/`` (each directory is written aside, then renamed, so a
killed run never leaves a half checkpoint that resume would pick up):

- ``model.safetensors`` — the model's weights (a bi-encoder's tied towers stored once)
- ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt`` — torch state dicts
- ``rng.pt`` — python/numpy/torch/cuda RNG states, one entry per rank
- ``state.json`` — step, epoch, batch in epoch, best metric so far, and anything else the trainer keeps

Which checkpoint is a run's past: the run's :func:`fingerprint` (of what defines its steps; each trainer leaves
out :data:`RESUMABLE_KEYS` and its own) must equal the one in ``state.json`` (:func:`resume_checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from dpr.atomic import atomic_path, clean_stale_temps_in
from dpr.trainkit.seed import set_rng_state

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
BEST_DIR = "best"
_STEP_RE = re.compile(r"^step_(\d+)$")


# Settings of every trainer that do not change what a step computes: a run may resume with other values (more
# steps, say). Each trainer adds its own to the set it leaves out of its fingerprint.
RESUMABLE_KEYS = frozenset({"epochs", "max_steps", "save_every", "keep_checkpoints", "log_every", "resume",
                            "cpu_threads"})


def fingerprint(blob: Mapping[str, Any]) -> str:
    """A run's identity: 16 hex digits of the sha256 of ``blob`` as sorted JSON (non-JSON values by ``str``)."""
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_identity(path: Path) -> list[int]:
    """``[size, mtime_ns]`` of a training file: what a fingerprint records of it (rewriting it is another run)."""
    st = Path(path).stat()
    return [st.st_size, st.st_mtime_ns]


def resolve_resume(resume: Any, output_dir: str | Path) -> Path | None:
    """The checkpoint ``train.resume`` asks for: auto (latest if any), true (latest, required), false, or a path."""
    value = str(resume).lower()
    if value in ("false", "no", "none", "0"):
        return None
    if value in ("auto", "true", "yes", "1"):
        found = latest_checkpoint(output_dir)
        if found is None and value != "auto":
            raise FileNotFoundError(f"train.resume=true but {output_dir}/checkpoints has no checkpoint")
        return found
    path = Path(str(resume))
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"train.resume={resume}: not a checkpoint directory (no state.json)")
    return path


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / CHECKPOINT_DIR / f"step_{step}"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``output_dir``, oldest first."""
    root = Path(output_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _STEP_RE.match(d.name)
        if m and d.is_dir() and (d / "state.json").is_file():
            found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def read_state(path: str | Path) -> dict:
    """A checkpoint's ``state.json`` ({} when there is none)."""
    f = Path(path) / "state.json"
    return json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any,
    state: dict,
    rng_states: list[dict],
    keep: int = 0,
    extra_tensors: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``checkpoints/step_<step>/`` atomically, then drop all but the newest ``keep`` (<= 0: keep all).

    ``extra_tensors`` (e.g. the cached corpus vectors of corpus negatives) go to ``extra.safetensors``."""
    target = checkpoint_dir(output_dir, step)
    with atomic_path(target) as tmp:
        tmp.mkdir()
        save_model(model, str(tmp / "model.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        if scaler is not None:
            torch.save(scaler.state_dict(), tmp / "scaler.pt")
        torch.save(rng_states, tmp / "rng.pt")
        if extra_tensors:
            save_file({k: v.contiguous() for k, v in extra_tensors.items()}, str(tmp / "extra.safetensors"))
        (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=2), encoding="utf-8")
    log.info("saved checkpoint %s", target)
    prune_checkpoints(output_dir, keep)
    return target


def prune_checkpoints(output_dir: str | Path, keep: int) -> None:
    """Drop all but the newest ``keep`` checkpoints (<= 0: keep all) and what killed writers left of any
    (a run killed while saving step N resumes from an earlier one and may never write step N again)."""
    clean_stale_temps_in(Path(output_dir) / CHECKPOINT_DIR)
    if keep <= 0:
        return
    for old in list_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: Any = None,
    map_location: str | torch.device = "cpu",
) -> tuple[dict, list[dict]]:
    """Load weights and optimizer/scheduler/scaler states in place. Returns ``(state, rng_states)``."""
    path = Path(path)
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"{path}: not a checkpoint (no state.json)")
    missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False, device=str(map_location))
    if missing or unexpected:
        raise ValueError(f"{path}/model.safetensors does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if optimizer is not None:
        # load_state_dict restores each group's saved flags, foreach/fused included: keep this run's
        # train.optimizer_impl (a resume may change it: dpr.training.resume.RESUMABLE_KEYS)
        impl = [{k: g[k] for k in ("foreach", "fused") if k in g} for g in optimizer.param_groups]
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=map_location, weights_only=True))
        for group, flags in zip(optimizer.param_groups, impl):
            group.update(flags)
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=True))
    if scaler is not None and (path / "scaler.pt").is_file():
        scaler.load_state_dict(torch.load(path / "scaler.pt", map_location="cpu", weights_only=True))
    rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=True)
    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    return state, rng


def load_extra(path: str | Path) -> dict[str, torch.Tensor]:
    """A checkpoint's ``extra_tensors`` ({} when it has none)."""
    f = Path(path) / "extra.safetensors"
    return load_file(str(f)) if f.is_file() else {}


def save_best(output_dir: str | Path, model: torch.nn.Module, info: dict) -> Path:
    """Keep the best weights so far in ``checkpoints/best/`` (atomic), with their step and metric."""
    target = Path(output_dir) / CHECKPOINT_DIR / BEST_DIR
    with atomic_path(target) as tmp:
        tmp.mkdir()
        save_model(model, str(tmp / "model.safetensors"))
        (tmp / "best.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
    return target


def read_best(output_dir: str | Path) -> dict | None:
    f = Path(output_dir) / CHECKPOINT_DIR / BEST_DIR / "best.json"
    return json.loads(f.read_text(encoding="utf-8")) if f.is_file() else None


def load_best(output_dir: str | Path, model: torch.nn.Module, map_location: str = "cpu") -> dict:
    """Load the best weights into ``model``; returns their ``best.json``."""
    d = Path(output_dir) / CHECKPOINT_DIR / BEST_DIR
    load_model(model, str(d / "model.safetensors"), strict=True, device=str(map_location))
    return json.loads((d / "best.json").read_text(encoding="utf-8"))


def resume_checkpoint(resume: Any, output_dir: str | Path, run_fingerprint: str, model: torch.nn.Module,
                      optimizer: torch.optim.Optimizer, scheduler: Any, *, rank: int = 0,
                      map_location: str | torch.device = "cpu", scaler: Any = None) -> tuple[int, dict]:
    """``(step, state)`` of the checkpoint ``resume`` asks for (:func:`resolve_resume`), loaded into ``model``,
    ``optimizer`` and ``scheduler`` with its RNG state restored; ``(0, {})`` when there is none. One of another run
    (another fingerprint) is ignored with a warning under ``resume=auto``, refused otherwise (a *finished* run of
    another fingerprint is refused before: `dpr.trainkit.finished_run`). ``rank``: whose RNG state to restore."""
    ckpt = resolve_resume(resume, output_dir)
    if ckpt is None:
        return 0, {}
    if read_state(ckpt).get("fingerprint") != run_fingerprint:
        if str(resume).lower() != "auto":
            raise ValueError(f"{ckpt}: checkpoint of a different run (model, data or settings changed)")
        log.warning("ignoring %s: written by a run with other settings or data", ckpt)
        return 0, {}
    state, rng = load_checkpoint(ckpt, model, optimizer, scheduler, scaler, map_location=map_location)
    # dropout draws continue where the killed run left them (each rank its own, under torchrun)
    set_rng_state(rng[rank % len(rng)])
    log.info("resumed from %s at step %d", ckpt, int(state["step"]))
    return int(state["step"]), state


__all__ = [
    "CHECKPOINT_DIR", "BEST_DIR", "RESUMABLE_KEYS", "fingerprint", "file_identity", "resolve_resume", "checkpoint_dir",
    "list_checkpoints", "latest_checkpoint", "read_state", "save_checkpoint", "prune_checkpoints", "load_checkpoint",
    "load_extra", "save_best", "read_best", "load_best", "resume_checkpoint",
]
