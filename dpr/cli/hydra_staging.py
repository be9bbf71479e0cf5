"""``dpr-train``'s Hydra files (its log and ``.hydra/``) stay out of the run directory until the run's checks pass.

Hydra opens ``<run dir>/train.log`` and writes ``<run dir>/.hydra/`` before any code of the command runs. A run
that its checks then refuse (a file of the user's inside the directory, a finished run with other settings, a run
directory in use) would leave both behind in a directory whose refusal says nothing was changed. So rank 0 of a
single run points them at a staging directory of its own under the system's temporary directory
(:func:`stage_overrides`); once every check has passed, :func:`commit` moves them into the run directory (the log
goes on being written there, appended to a resumed run's log); otherwise :func:`discard` drops them, and a run
directory that Hydra created for the refused run is removed while it is empty.

In a sweep (``-m``) each job's log is staged the same way (``<stage>/<job num>.train.log``; its ``.hydra/`` goes
to ``.hydra.pending.<pid>/`` inside the job directory, `dpr.run_dir`): a refused job leaves no log, and a job
directory Hydra made for it goes while empty (:func:`note_sweep` records what the sweep directory held before).
Where no job passed its checks, the sweep's ``multirun.yaml`` goes when the command ends (the one there before is
put back), and so does a sweep directory Hydra made. A user who chose Hydra's logging, ``hydra.output_subdir``,
``hydra.mode``, a sweep's launcher or a primary config of their own keeps Hydra's own placement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterable

from dpr.atomic import OutputConflictError, atomic_path, write_text_atomic

HYDRA_DIR = ".hydra"
# Keys and config groups after which Hydra's own placement is kept (the user chose it).
_USER_CHOSEN = ("hydra.output_subdir", "hydra.job_logging", "hydra/job_logging", "hydra.mode", "hydra.job.name")
_MULTIRUN_FLAGS = ("-m", "--multirun")
# A sweep's launcher chosen by the user (joblib, submitit, Slurm) runs each job in a process of its own, maybe on
# another machine: neither this process's staging directory nor its record of the stage reaches the job.
_LAUNCHER = ("hydra/launcher", "hydra.launcher")
# the first line of a log written by Hydra's default logging: "[2026-01-31 12:00:00,123][logger][LEVEL] - ..."
_LOG_LINE = re.compile(rb"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\]\[")
_PREFIX = "dpr-train-hydra-"  # <tmp>/dpr-train-hydra-<pid>-<random>/
LOG_NAME = "train.log"  # ${hydra.job.name}.log of conf/train.yaml (hydra.job.name: train)
MULTIRUN_YAML = "multirun.yaml"  # what Hydra's sweeper writes in the sweep directory before any job


@dataclasses.dataclass
class _Staged:
    stage: Path  # the staging directory (outside the run directory)
    target: Path | None  # output_dir as typed, made absolute; None when not given plainly (the default)
    existed: bool  # whether ``target`` was there before Hydra started
    sweep: bool = False  # a multirun: one log per job, each run directory a job directory in the sweep directory
    committed: set[Path] = dataclasses.field(default_factory=set)  # run directories whose checks passed
    sweep_dir: Path | None = None  # a sweep's directory, once :func:`note_sweep` saw it (absolute)
    sweep_before: frozenset[str] | None = None  # the names in it then; None: it was not there
    sweep_yaml: str | None = None  # the multirun.yaml it held then (a sweep's before this one), which Hydra replaces


_current: _Staged | None = None


def _keys(overrides: Iterable[str]) -> set[str]:
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides}


def _own_primary_config(flags: list[str]) -> bool:
    """Whether the user's config replaces conf/train.yaml (``--config-name``, ``--config-path``, or a
    ``--config-dir`` holding a train.yaml): its logging may have no file handler to redirect."""
    for i, f in enumerate(flags):
        name, eq, value = f.partition("=")
        if name in ("--config-name", "-cn", "--config-path", "-cp"):
            return True
        if name in ("--config-dir", "-cd"):
            folder = value if eq else (flags[i + 1] if i + 1 < len(flags) else "")
            if (Path(folder) / "train.yaml").is_file():
                return True
    return False


def applies(overrides: Iterable[str], flags: Iterable[str]) -> bool:
    """Whether this command line's Hydra files can be staged (see the module notes)."""
    flags = list(flags)
    if _own_primary_config(flags):
        return False
    sweep = any(f.partition("=")[0] in _MULTIRUN_FLAGS for f in flags)
    kept = _USER_CHOSEN + (_LAUNCHER if sweep else ())
    return not any(k == c or k.startswith(c + ".") for k in _keys(overrides) for c in kept)


def _remove_dead_stages() -> None:
    """Staging directories of runs killed before they ended (named by their process id, which is gone)."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(tempfile.gettempdir()):
            m = re.match(rf"^{_PREFIX}(\d+)-", entry)
            if m is None:
                continue
            try:
                os.kill(int(m.group(1)), 0)
            except ProcessLookupError:
                shutil.rmtree(Path(tempfile.gettempdir()) / entry, ignore_errors=True)
            except OSError:  # alive, another user's
                continue


def stage_overrides(overrides: list[str], flags: list[str]) -> dict[str, str] | None:
    """Hydra overrides that send its log and ``.hydra/`` to a fresh staging directory (made here), or None where
    staging does not apply (:func:`applies`) or the directory's path cannot be written as an override value."""
    global _current
    if not applies(overrides, flags):
        return None
    _remove_dead_stages()
    stage = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
    if any(c in str(stage) for c in "'\\"):  # not quotable in Hydra's override grammar
        shutil.rmtree(stage, ignore_errors=True)
        return None
    given = [o.split("=", 1)[1] for o in overrides if "=" in o and _keys([o]) & {"output_dir", "hydra.run.dir"}]
    target = Path(os.path.abspath(given[-1])) if given and "${" not in given[-1] else None
    sweep = any(f.partition("=")[0] in _MULTIRUN_FLAGS for f in flags)
    _current = _Staged(stage, target, target is not None and os.path.lexists(target), sweep=sweep)
    if sweep:  # each job's .hydra/ is held back inside its own directory (dpr.run_dir's pending name)
        return {"hydra.job_logging.handlers.file.filename": f"'{stage}/${{hydra.job.num}}.{LOG_NAME}'"}
    return {"hydra.output_subdir": f"'{stage / HYDRA_DIR}'",
            "hydra.job_logging.handlers.file.filename": f"'{stage / LOG_NAME}'"}


def note_sweep(sweep_dir: str | Path) -> None:
    """A sweep starts (Hydra has made neither its directory nor any job's): what ``sweep_dir`` holds now, so that a
    refused job removes only a directory Hydra made for it."""
    if _current is None or not _current.sweep:
        return
    _current.sweep_dir = Path(os.path.abspath(sweep_dir))
    with contextlib.suppress(OSError):
        _current.sweep_before = frozenset(os.listdir(_current.sweep_dir))
    yaml = _current.sweep_dir / MULTIRUN_YAML
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if yaml.is_file() and not yaml.is_symlink():
            _current.sweep_yaml = yaml.read_text(encoding="utf-8")


def _staged_log() -> Path:
    """Where Hydra writes this run's (this sweep job's) log until :func:`commit`."""
    assert _current is not None
    if not _current.sweep:
        return _current.stage / LOG_NAME
    from hydra.core.hydra_config import HydraConfig

    return _current.stage / f"{HydraConfig.get().job.num}.{LOG_NAME}"


def check_log(run_dir: str | Path) -> None:
    """OutputConflictError when ``<run dir>/train.log`` is a file of the user's (not a log Hydra wrote): the run's
    log would be appended to it."""
    path = Path(run_dir) / LOG_NAME
    if _current is None or not path.is_file() or path.is_symlink():
        return
    with open(path, "rb") as f:
        head = f.read(64)
    if head.strip() and not _LOG_LINE.match(head):
        raise OutputConflictError(path, "is not a log dpr-train wrote, and the run appends its log to it (your own "
                                  "file?)")


def _move_log(src: Path, dst: Path) -> None:
    """Append the staged log to ``dst`` and point the handler writing it there (under the handler's lock, so no
    record is lost between the copy and the switch)."""
    handlers = [h for h in logging.getLogger().handlers
                if isinstance(h, logging.FileHandler) and Path(h.baseFilename) == src]
    with contextlib.ExitStack() as stack:
        for h in handlers:
            h.acquire()
            stack.callback(h.release)
            h.flush()
        if src.is_file():
            with open(src, "rb") as f, open(dst, "ab") as out:
                shutil.copyfileobj(f, out)
        for h in handlers:
            h.baseFilename = str(dst)
            if h.stream is not None:  # opened (Hydra's handler is not delayed): reopen at the new place
                h.setStream(open(dst, "a", encoding=h.encoding, errors=h.errors)).close()


def commit(run_dir: str | Path) -> None:
    """The run's checks passed: its ``.hydra/`` replaces the run directory's (atomically) and its log goes on in
    ``<run dir>/train.log``. Nothing when nothing was staged."""
    run_dir = Path(os.path.abspath(run_dir))
    if _current is None or run_dir in _current.committed:
        return
    staged_hydra = _current.stage / HYDRA_DIR
    if staged_hydra.is_dir() and not _current.sweep:
        with atomic_path(run_dir / HYDRA_DIR) as tmp:
            shutil.copytree(staged_hydra, tmp)
    _move_log(_staged_log(), run_dir / LOG_NAME)
    _current.committed.add(run_dir)


def _made_by_hydra(run_dir: Path) -> bool:
    """Whether Hydra made ``run_dir`` for this run (a single run's, or one job's of a sweep)."""
    assert _current is not None
    if _current.sweep:
        before = _current.sweep_before
        return (_current.sweep_dir is not None and run_dir.parent == _current.sweep_dir
                and (before is None or run_dir.name not in before))
    if _current.target is None:  # the default output_dir: a new directory named by the time
        return True
    return not _current.existed and run_dir == _current.target


def abandon(run_dir: str | Path) -> None:
    """The run (sweep job) was refused or failed before :func:`commit`: the run directory Hydra made for it goes
    if empty."""
    run_dir = Path(os.path.abspath(run_dir))
    if _current is None or run_dir in _current.committed:
        return
    if _made_by_hydra(run_dir):
        with contextlib.suppress(OSError):  # not empty: the run wrote there (or it is not ours to remove)
            run_dir.rmdir()


def _undo_refused_sweep() -> None:
    """A sweep none of whose jobs passed its checks: the multirun.yaml Hydra wrote goes (the one there before is
    put back), and so does the sweep directory where Hydra made it and nothing else is in it."""
    assert _current is not None
    sweep_dir, before = _current.sweep_dir, _current.sweep_before
    if sweep_dir is None or _current.committed:
        return
    yaml = sweep_dir / MULTIRUN_YAML
    with contextlib.suppress(OSError):
        if _current.sweep_yaml is not None:
            write_text_atomic(yaml, _current.sweep_yaml)
        elif before is None or MULTIRUN_YAML not in before:
            yaml.unlink()
        if before is None:
            sweep_dir.rmdir()  # fails where something else is in it


def discard() -> None:
    """The command ends: the staging directory goes (after :func:`commit` it holds only copies)."""
    global _current
    if _current is not None:
        if _current.sweep:
            _undo_refused_sweep()
        shutil.rmtree(_current.stage, ignore_errors=True)
        _current = None
