"""A finished run is never replaced in silence: the cross-encoder's and the reader's trainers refuse an
``output_dir`` that holds a finished run (``train_summary.json``) of other settings or data unless told
``overwrite=true``, as ``dpr-train`` does (`dpr.run_dir`).

A run's identity is its fingerprint (`dpr.trainkit.checkpoint.fingerprint`: the settings that decide its steps
and the training file's identity), recorded in the summary. Summaries written before the fingerprint was
recorded are compared by the fingerprint their own config gives today (the caller's ``fingerprint_of``).
With ``overwrite=true`` the old run's outputs are removed *before* training, the summary first, so a run killed
midway never leaves a directory that looks finished but mixes two runs.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

log = logging.getLogger(__name__)

SUMMARY = "train_summary.json"
# what every trainkit trainer writes besides its final model directory
COMMON_OUTPUTS = ("metrics.jsonl", "validation.jsonl", "checkpoints")


def read_summary(run_dir: str | Path) -> dict | None:
    """The finished run's summary in ``run_dir`` (None when there is none, or it is unreadable: not finished)."""
    try:
        summary = json.loads((Path(run_dir) / SUMMARY).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, ValueError, UnicodeDecodeError):
        return None
    return summary if isinstance(summary, dict) else None


def config_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """``key: old -> new`` for every leaf where two nested configs differ (the refusal's message)."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new), key=str)
        return [d for k in keys for d in config_diff(old.get(k), new.get(k), f"{prefix}{k}.")]
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def check_finished_run(run_dir: str | Path, run_fingerprint: str, config: Mapping[str, Any], *, overwrite: bool,
                       outputs: Iterable[str], fingerprint_of: Callable[[dict], str] | None = None,
                       ignored: Iterable[str] = (), ignored_sections: Iterable[str] = (), remove: bool = True) -> str:
    """``"new"`` (no finished run), ``"same"`` (the same run: it resumes or finishes as before) or
    ``"overwritten"``. A finished run of another fingerprint is refused in one ValueError naming what differs,
    unless ``overwrite``: then its summary, ``outputs`` (the trainer's final model directory) and
    :data:`COMMON_OUTPUTS` are removed (only where ``remove``: one writer under torchrun).

    ``config``: the new run's config, compared key by key with the summary's ``config`` for the message
    (``ignored``: ``train`` keys that do not change a step, ``ignored_sections``: top-level sections that do not
    either, e.g. the scoring settings; both left out of the comparison).
    """
    run_dir = Path(run_dir)
    summary = read_summary(run_dir)
    if summary is None:
        return "new"
    old = summary.get("fingerprint")
    if old is None and fingerprint_of is not None and isinstance(summary.get("config"), dict):
        try:
            old = fingerprint_of(summary["config"])
        except (ValueError, TypeError, KeyError):  # a config this version no longer reads: another run
            old = None
    if old == run_fingerprint:
        return "same"
    skip, sections = set(ignored), set(ignored_sections)

    def relevant(c: Any) -> Any:
        if not isinstance(c, dict):
            return c
        c = {k: v for k, v in c.items() if k not in sections}
        if isinstance(c.get("train"), dict):
            c["train"] = {k: v for k, v in c["train"].items() if k not in skip}
        return c

    changes = config_diff(relevant(summary.get("config")), relevant(dict(config))) or ["the training data"]
    return refuse_or_remove(run_dir, changes, overwrite=overwrite,
                            names=(*outputs, *COMMON_OUTPUTS) if remove else None)


def refuse_or_remove(run_dir: Path, changes: list[str], *, overwrite: bool, names: Iterable[str] | None) -> str:
    """A finished run of other settings (``changes``: what differs) in ``run_dir``: refused in one ValueError,
    or with ``overwrite`` its summary and then ``names`` removed (None: nothing, another process removes them);
    returns ``"overwritten"``. Every trainer's finished-run check ends here (this module's and `dpr.run_dir`'s)."""
    if not overwrite:
        shown = "; ".join(changes[:5]) + (f"; ... ({len(changes)} keys)" if len(changes) > 5 else "")
        raise ValueError(f"{run_dir} holds a finished run trained with other settings or data ({shown}); "
                         "train into a new output_dir=, or pass overwrite=true to replace that run")
    if names is not None:
        log.warning("%s: overwrite=true: removing the finished run (%s) before training", run_dir,
                    "; ".join(changes[:3]))
        # the summary first: from here on the directory no longer looks finished, whatever happens next
        for name in dict.fromkeys((SUMMARY, *names)):
            p = run_dir / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
    return "overwritten"


__all__ = ["SUMMARY", "COMMON_OUTPUTS", "read_summary", "config_diff", "check_finished_run", "refuse_or_remove"]
