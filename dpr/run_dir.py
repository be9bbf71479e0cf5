"""A training run directory is never half-overwritten.

`dpr-train` into a directory that holds a *finished* run (``train_summary.json``) trained with other
settings is refused, with the differing keys and the two ways out (a new ``output_dir=``, or
``overwrite=true``). With ``overwrite=true`` the old run's outputs are removed *before* training
starts, so a run killed midway never leaves a directory that looks finished but mixes two runs
(old weights and summary, new config and metrics). The same settings resume or finish as before.

Hydra writes ``<run dir>/.hydra/`` at start-up, before any check could run; `dpr.cli.train` points
it at ``.hydra.pending/`` and `commit_hydra_dir` moves that onto ``.hydra/`` only once the run is
allowed (a refused or failed start leaves the finished run's ``.hydra/config.yaml`` as it was).

A run's identity is its settings *and its data*: the summary records the sha256 of the training and dev
files (``data_fingerprints``), so another ``train_file=`` (or a re-prepared dataset) into a finished run
is "other settings" too, whatever the file is called. Runs finished before fingerprints were recorded
are compared on their settings only (logged): their data cannot be known any more, and refusing them
would make every old run directory unusable.

One run owns a run directory at a time (`lock_run_dir`, taken by each trainer's command before its
checks): a second run into it is refused in one line naming the holder (pid, host, since when). The lock
is a ``flock`` on the directory itself, which the kernel drops when its holder dies, so the lock of a killed
run is taken over by the next one, and which no file deleted by hand can lose; ``<run dir>/.dpr-run.lock`` only
says who holds it. A run directory inside another run's (``dpr-train output_dir=<a pipeline's>/model``) is
refused too while that run holds its own: the pipeline writes its subdirectories.

A run directory may already hold the user's own files. Once it holds the lock, each command checks the files
it will write there (:data:`OUTPUTS_INSIDE`): one of those names holding a file that does not look like the
project's output of that name (the user's ``README.md`` or ``metrics.jsonl``) is refused in one line before any
work (`dpr.atomic.check_outputs_inside`); files of other names are never touched.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Any, Iterator, Mapping

from dpr.atomic import atomic_path, check_outputs_inside, sha256_file
from dpr.models.run_format import MODEL_FILES
from dpr.trainkit.finished_run import SUMMARY, COMMON_OUTPUTS, config_diff, read_summary, refuse_or_remove

log = logging.getLogger(__name__)

PENDING_HYDRA = ".hydra.pending"
LOCK_FILE = ".dpr-run.lock"


_TRAINER_FILES = ("README.md", "metrics.jsonl", "validation.jsonl", "train_summary.json")
_PIPELINE_FILES = {"timings.json": None, "eval/report.json": None, "eval/report.md": None,
                   **{f"model/{n}": None for n in _TRAINER_FILES},
                   # (rerank/dev.json is the rerank stage's own record of its dev choice, not a results file)
                   **{f"{system}/{split}.{ext}": kind for system in ("bm25", "dense", "hybrid")
                      for split in ("test", "dev") for ext, kind in (("json", "dpr_results"), ("trec", "trec_run"))}}
# The files each locking command writes into its run directory under a name a user's file may have (with the
# kind of a generic name: `dpr.atomic.check_outputs_inside`).
OUTPUTS_INSIDE: dict[str, tuple[str, ...] | dict[str, str | None]] = {
    "dpr-train": _TRAINER_FILES,
    "dpr-rerank train": _TRAINER_FILES,
    "dpr-reader train": _TRAINER_FILES,
    "dpr-pipeline": _PIPELINE_FILES,
}


class RunDirBusyError(OSError):
    """Another live run holds the run directory (str(): one line naming it); an expected failure, exit 2."""

    def __str__(self) -> str:
        return str(self.args[0])


def _holder(text: str) -> str:
    try:
        h = json.loads(text)
        return f"pid {h['pid']} on {h['host']} since {h['since']} ({h['command']})"
    except (ValueError, TypeError, KeyError):
        return "a process that left no details"


def _busy(run_dir: Path, path: Path) -> RunDirBusyError:
    return RunDirBusyError(f"{run_dir} is in use by another run: {_holder(path.read_text(errors='replace'))}; "
                           "wait for it to finish, or train into another output_dir=")


def _describe(run_dir: Path) -> str:
    try:
        return _holder((run_dir / LOCK_FILE).read_text(errors="replace"))
    except OSError:
        return "a process that left no details"


def _busy(run_dir: Path, held: Path | None = None) -> RunDirBusyError:
    where = f"{run_dir} is in use by another run" if held is None or held == run_dir else \
        f"{run_dir} is inside {held}, in use by another run"
    return RunDirBusyError(f"{where}: {_describe(held or run_dir)}; wait for it to finish, or train into another "
                           "output_dir=")


_HELD: set[str] = set()  # run directories this process holds (the directories below them are its own to write)


def _try_lock(directory: Path, shared: bool) -> int | None:
    """An fd of ``directory`` holding its flock (exclusive, or shared for a test), or None when another holds it.
    Raises OSError where the directory cannot be opened."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _check_enclosing(run_dir: Path) -> None:
    """Raise :class:`RunDirBusyError` if a live run holds a directory that encloses ``run_dir``."""
    for parent in Path(os.path.abspath(run_dir)).parents:
        if str(parent) in _HELD:
            continue
        try:
            fd = _try_lock(parent, shared=True)
        except OSError:  # cannot be opened (permissions): no run of ours holds it
            continue
        if fd is None:
            raise _busy(Path(run_dir), parent)
        os.close(fd)


def check_run_dir_free(run_dir: str | Path) -> None:
    """Raise :class:`RunDirBusyError` if a live run holds ``run_dir`` or a directory enclosing it; creates and
    changes nothing. For a check before Hydra starts (it writes its log and ``.hydra/`` into the run directory
    before any code of ours runs); `lock_run_dir` still decides."""
    run_dir = Path(run_dir)
    _check_enclosing(run_dir)
    try:
        fd = _try_lock(run_dir, shared=False)
    except OSError:  # no directory: nobody holds it
        return
    if fd is None:
        raise _busy(run_dir)
    os.close(fd)


@contextlib.contextmanager
def lock_run_dir(run_dir: str | Path, command: str) -> Iterator[None]:
    """Hold ``run_dir`` for this run (creating it); raise :class:`RunDirBusyError` if another live run holds it, or
    a directory enclosing it.

    Take it before the run directory's checks (`prepare_run_dir`), so that two runs cannot both find it free
    of a finished run and then both write it. A dead holder's lock is free again (the kernel releases a
    ``flock`` with its process) and is taken over, with a log line."""
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise NotADirectoryError(f"output_dir {run_dir}: exists and is not a directory") from None
    try:
        _check_enclosing(run_dir)
        dfd = _try_lock(run_dir, shared=False)
        if dfd is None:
            raise _busy(run_dir)
    except BaseException:
        _drop_if_empty(run_dir, created)
        raise
    key = os.path.abspath(run_dir)
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            previous = os.read(fd, 4096).decode(errors="replace")
            if previous.strip():  # the file still names a holder: that process died without releasing it
                log.warning("%s: taking over the lock left by %s, no longer running", run_dir, _holder(previous))
            since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
            body = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since,
                               "command": command})
            os.ftruncate(fd, 0)
            os.pwrite(fd, body.encode(), 0)
        finally:
            os.close(fd)
        _HELD.add(key)
        # before any work: a file of the user's where this command writes is refused, not replaced
        check_outputs_inside(run_dir, OUTPUTS_INSIDE.get(command, _TRAINER_FILES))
        yield
    finally:
        _HELD.discard(key)
        with contextlib.suppress(FileNotFoundError):  # released: a refused or finished run leaves nothing behind
            os.unlink(path)
        os.close(dfd)  # drops the flock
        _drop_if_empty(run_dir, created)


def _drop_if_empty(run_dir: Path, created: bool) -> None:
    """A run refused before it wrote anything leaves no directory behind that it made only for its lock."""
    if created:
        with contextlib.suppress(OSError):  # not empty (the run wrote), or already gone
            run_dir.rmdir()


# What a training run writes (removed on purpose by overwrite=true; .hydra/ and train.log are Hydra's).
RUN_OUTPUTS = (SUMMARY, *MODEL_FILES, *COMMON_OUTPUTS)
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


def data_fingerprints(train_file: str | Path, dev_file: str | Path | None) -> dict[str, str | None]:
    """``{"train": sha256, "dev": sha256 or None}`` of the files a run trains and validates on (what the
    summary records and :func:`prepare_run_dir` compares)."""
    dev = Path(dev_file) if dev_file is not None else None
    return {"train": sha256_file(train_file), "dev": sha256_file(dev) if dev is not None and dev.is_file() else None}


def _finished_summary(run_dir: str | Path) -> dict | None:
    summary = read_summary(run_dir)
    return summary if summary is not None and isinstance(summary.get("config"), dict) else None


def finished_config(run_dir: str | Path) -> dict | None:
    """The config of the finished run in ``run_dir`` (from its summary), or None if there is none."""
    summary = _finished_summary(run_dir)
    return summary["config"] if summary is not None else None


def _data_changes(run_dir: Path, old: Any, new: Mapping[str, str | None] | None) -> list[str]:
    if new is None:
        return []
    if not isinstance(old, dict):
        log.info("%s: the finished run recorded no data fingerprints (made before they were): compared on its "
                 "settings only", run_dir)
        return []
    short = lambda h: h[:12] if isinstance(h, str) else h  # noqa: E731
    return [f"{name} data: sha256 {short(old.get(name))} -> {short(new.get(name))}"
            for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]


def prepare_run_dir(run_dir: str | Path, conf: Mapping[str, Any], overwrite: bool = False,
                    data: Mapping[str, str | None] | None = None) -> str:
    """Check ``run_dir`` before training; returns "new", "same" (resume/finish) or "overwritten".

    ``data``: the new run's :func:`data_fingerprints`, compared with the finished run's (None: settings
    only). Raises ValueError (one line) when a finished run with other settings or data is there and
    ``overwrite`` is false.
    """
    run_dir = Path(run_dir)
    summary = _finished_summary(run_dir)
    if summary is None:
        return "new"
    changes = config_diff(_relevant(summary["config"]), _relevant(conf))
    changes += _data_changes(run_dir, summary.get("data_fingerprints"), data)
    if not changes:
        return "same"
    return refuse_or_remove(run_dir, changes, overwrite=overwrite, names=RUN_OUTPUTS)


def pending_hydra_name() -> str:
    """This process's name for Hydra's pending ``.hydra/``: per process, so that a second run started into the
    same directory (refused by the lock) never writes over, or discards, the first run's pending one."""
    return f"{PENDING_HYDRA}.{os.getpid()}"


def commit_hydra_dir(run_dir: str | Path, pending: str | None = None) -> None:
    """Move Hydra's ``<run dir>/.hydra.pending.<pid>/`` onto ``.hydra/`` (atomically; nothing if absent)."""
    src = Path(run_dir) / (pending or pending_hydra_name())
    if not src.is_dir():
        return
    with atomic_path(Path(run_dir) / ".hydra") as tmp:
        src.rename(tmp)


def discard_hydra_dir(run_dir: str | Path, pending: str | None = None) -> None:
    shutil.rmtree(Path(run_dir) / (pending or pending_hydra_name()), ignore_errors=True)
