"""A training run directory is never half-overwritten.

`dpr-train` into a directory that holds a *finished* run (``train_summary.json``) trained with other
settings is refused, with the differing keys and the two ways out (a new ``output_dir=``, or
``overwrite=true``). With ``overwrite=true`` the old run's outputs are removed *before* training
starts, so a run killed midway never leaves a directory that looks finished but mixes two runs
(old weights and summary, new config and metrics). The same settings resume or finish as before.

Hydra writes ``<run dir>/.hydra/`` at start-up, before any check could run; `dpr.cli.train` points
it at ``.hydra.pending/`` and `commit_hydra_dir` moves that onto ``.hydra/`` only once the run is
allowed (a refused or failed start leaves the finished run's ``.hydra/config.yaml`` as it was).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any, Mapping

from dpr.atomic import atomic_path

log = logging.getLogger(__name__)

SUMMARY = "train_summary.json"
PENDING_HYDRA = ".hydra.pending"
# What a training run writes (removed on purpose by overwrite=true; .hydra/ and train.log are Hydra's).
RUN_OUTPUTS = (SUMMARY, "biencoder.json", "question_encoder", "passage_encoder", "projection.safetensors",
               "metrics.jsonl", "validation.jsonl", "checkpoints")
# Keys that decide what a run computes; paths and logging do not (a moved data dir is the same data).
COMPARED = ("model", "data", "train", "seed")
_IGNORED_DATA_KEYS = ("mirror_dir", "cache_dir")


def _relevant(conf: Mapping[str, Any]) -> dict:
    out = {k: conf.get(k) for k in COMPARED}
    if isinstance(out.get("data"), dict):
        out["data"] = {k: v for k, v in out["data"].items() if k not in _IGNORED_DATA_KEYS}
    if isinstance(out.get("model"), dict):
        from dpr.models.biencoder import without_empty_prefixes

        out["model"] = without_empty_prefixes(out["model"])
    return out


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new), key=str)
        return [d for k in keys for d in _diff(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def finished_config(run_dir: str | Path) -> dict | None:
    """The config of the finished run in ``run_dir`` (from its summary), or None if there is none."""
    try:
        summary = json.loads((Path(run_dir) / SUMMARY).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    conf = summary.get("config") if isinstance(summary, dict) else None
    return conf if isinstance(conf, dict) else None


def prepare_run_dir(run_dir: str | Path, conf: Mapping[str, Any], overwrite: bool = False) -> str:
    """Check ``run_dir`` before training; returns "new", "same" (resume/finish) or "overwritten".

    Raises ValueError (one line) when a finished run with other settings is there and ``overwrite``
    is false.
    """
    run_dir = Path(run_dir)
    old = finished_config(run_dir)
    if old is None:
        return "new"
    changes = _diff(_relevant(old), _relevant(conf))
    if not changes:
        return "same"
    if not overwrite:
        shown = "; ".join(changes[:5]) + (f"; ... ({len(changes)} keys)" if len(changes) > 5 else "")
        raise ValueError(f"{run_dir} holds a finished run trained with other settings ({shown}); "
                         "train into a new output_dir=, or pass overwrite=true to replace that run")
    log.warning("%s: overwrite=true: removing the finished run (%s) before training", run_dir, "; ".join(changes[:3]))
    # the summary first: from here on the directory no longer looks finished, whatever happens next
    for name in RUN_OUTPUTS:
        p = run_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    return "overwritten"


def commit_hydra_dir(run_dir: str | Path, pending: str = PENDING_HYDRA) -> None:
    """Move Hydra's ``<run dir>/.hydra.pending/`` onto ``.hydra/`` (atomically; nothing if absent)."""
    src = Path(run_dir) / pending
    if not src.is_dir():
        return
    with atomic_path(Path(run_dir) / ".hydra") as tmp:
        src.rename(tmp)


def discard_hydra_dir(run_dir: str | Path, pending: str = PENDING_HYDRA) -> None:
    shutil.rmtree(Path(run_dir) / pending, ignore_errors=True)
