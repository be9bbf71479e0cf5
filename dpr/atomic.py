"""Write-aside-then-rename helpers: a failed or killed run never leaves a half-written output behind.

`atomic_path(path)` gives the block a temporary path beside ``path`` and moves the result onto
``path`` only if the block succeeds:

- **No window without an output.** A file is moved in with one ``rename``. A directory that already
  exists is *exchanged* with the new one in one step (Linux ``renameat2(RENAME_EXCHANGE)``), then the
  old one is deleted; where the kernel or file system cannot exchange, the old directory is renamed
  into the temporary directory first and the next writer restores it if a crash struck between
  the two renames.
- **One writer at a time.** Writers of one path take an exclusive ``flock`` on a lock file (under
  ``<tmp>/dpr-locks/``, keyed by the absolute path, so output directories get no extra files); a
  second writer waits for the first instead of both renaming onto the same name.
- **Nothing the user owns is replaced.** A file output may replace a file its writer recognises as of its own
  kind (``same_kind=``, `dpr.output_kinds`: sniffed from the first bytes); a directory output may replace
  only a directory its writer recognises as its own (``owned=``, a check of its marker or manifest) or, where
  the writer gives none, one whose entries the new directory all has (an earlier save of the same layout).
  Anything else at the path (a directory under a file output, a file under a directory output, a directory
  holding other files) is refused with :class:`OutputConflictError` (one line; nothing is touched).
  A file a command writes *inside* an output directory (``README.md``, ``metrics.jsonl``, ``test.json``: the
  names of `dpr.output_kinds.INSIDE`) replaces only a file that looks like an earlier output of that name
  (:func:`check_outputs_inside`, which commands also call on their directory before any work).
- **Leftovers cleaned.** Temporary names are ``.<name>.<pid>-<random>.tmp``. While holding the lock
  no other writer of that path can be mid-write, so every such name found then belongs to a killed
  run and is removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

log = logging.getLogger(__name__)

# Locks held per (thread, path): re-entrant for nested writers of one path in one thread; another thread
# takes the flock on its own descriptor and so waits like another process would.
_held: dict[tuple[int, str], int] = {}
_OLD = ".old"  # inside a temporary directory: the previous output, moved aside (fallback only)


class OutputConflictError(FileExistsError):
    """Something the writer did not make stands where it would write (see the module notes); str() is one line."""

    def __init__(self, path: str | Path, message: str) -> None:
        super().__init__(f"{path}: {message}; nothing was changed (choose another output path, or move it away "
                         "yourself)")
        self.filename = str(path)

    def __str__(self) -> str:
        return str(self.args[0])


class OutputNotWritableError(PermissionError):
    """The directory an output goes to cannot be written (read-only, no permission); str() is one line naming it."""

    def __str__(self) -> str:
        return str(self.args[0])


def _is_real_dir(path: Path) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


def check_replaceable(path: str | Path, directory: bool, owned: Callable[[Path], bool | str] | None = None,
                      same_kind: Callable[[Path], str | None] | None = None) -> None:
    """Raise :class:`OutputConflictError` unless a ``directory`` (else a file) output may be written at ``path``.

    A file output: nothing there, a symlink, or a file ``same_kind`` passes (it returns None for a file of the
    kind the command writes, else what the file looks like: `dpr.output_kinds.foreign`; without it, any file).
    A directory output: nothing there, a symlink, an empty directory, or a directory ``owned`` recognises (this
    command's marker or manifest is in it; ``owned`` may return a string instead of False: why not, for the
    refusal)."""
    path = Path(path)
    if not os.path.lexists(path) or os.path.islink(path):
        return
    if not directory:
        if _is_real_dir(path):
            raise OutputConflictError(path, "is a directory, and this command writes a file there")
        what = same_kind(path) if same_kind is not None else None
        if what is not None:
            raise OutputConflictError(path, f"{what}, which this command writes there")
        return
    if not _is_real_dir(path):
        raise OutputConflictError(path, "is a file, and this command writes a directory there")
    verdict = owned(path) if owned is not None and any(path.iterdir()) else True
    if isinstance(verdict, str):  # the writer's own reason (its marker is there, but names another output)
        raise OutputConflictError(path, f"is a directory this command did not write: {verdict}")
    if not verdict:
        raise OutputConflictError(path, "is a directory this command did not write (no marker of its output "
                                  "in it)")


def check_outputs_inside(directory: str | Path, names: Iterable[str] | Mapping[str, str]) -> None:
    """Raise :class:`OutputConflictError` naming the first of ``names`` (paths relative to ``directory``) that is
    a file of the user's: one that does not look like the project's output of that name
    (`dpr.output_kinds.foreign_inside`; a mapping gives each name's kind, `dpr.output_kinds.KINDS`). For a
    command's start, before any work; reads only first bytes."""
    from dpr.output_kinds import foreign_inside

    directory = Path(directory)
    kinds = names if isinstance(names, Mapping) else dict.fromkeys(names)
    for name, kind in kinds.items():
        path = directory / name
        if os.path.isfile(path) and not os.path.islink(path):
            what = foreign_inside(path, kind)
            if what is not None:
                raise OutputConflictError(path, f"{what}, which this command writes there (your own file?)")


def check_swap(new: Path, path: Path) -> None:
    """The last check before the rename, for writers that gave no ``owned=``: what the block made decides."""
    if not os.path.lexists(path) or os.path.islink(path):
        return
    if not _is_real_dir(new):
        check_replaceable(path, directory=False)
        return
    check_replaceable(path, directory=True)
    extra = sorted(set(os.listdir(path)) - set(os.listdir(new)))
    if extra:  # not an earlier save of the same layout: the user's directory, or another kind of output
        shown = ", ".join(extra[:3]) + (f" (+{len(extra) - 3} more)" if len(extra) > 3 else "")
        raise OutputConflictError(path, f"is a directory holding files this command does not write ({shown})")


def lock_dir() -> Path:
    return Path(os.environ.get("DPR_LOCK_DIR") or Path(tempfile.gettempdir()) / "dpr-locks")


def _lock_file(path: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    return lock_dir() / f"{path.name[:60]}.{key}.lock"


@contextlib.contextmanager
def path_lock(path: str | Path, wait: bool = True) -> Iterator[bool]:
    """Hold the exclusive writer lock of ``path`` (waits, and says so, while another process holds it;
    with ``wait=False`` yields False instead, holding nothing). Yields True once held.

    The kernel drops a ``flock`` when its holder dies, so a killed writer never blocks the next one.
    """
    path = Path(path)
    key = (threading.get_ident(), str(path.resolve()))
    if key in _held:
        _held[key] += 1
        try:
            yield True
        finally:
            _held[key] -= 1
        return
    lf = _lock_file(path)
    lf.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lf, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            log.warning("%s is being written by another process; waiting for it to finish", path)
            fcntl.flock(fd, fcntl.LOCK_EX)
        _held[key] = 1
        try:
            yield True
        finally:
            del _held[key]
    finally:
        os.close(fd)  # releases the lock


_TEMP_TAIL = r"\.(?:\d+-[0-9a-f]+|[A-Za-z0-9_]{8})\.tmp$"
_ANY_TEMP = re.compile(r"^\.(.+)" + _TEMP_TAIL)


def _temp_re(name: str) -> re.Pattern:
    # ours: .<name>.<pid>-<hex>.tmp; before this module locked, mkdtemp's .<name>.<8 chars>.tmp
    return re.compile(rf"^\.{re.escape(name)}" + _TEMP_TAIL)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def clean_stale_temps(path: str | Path) -> list[Path]:
    """Remove temporary leftovers of killed writers of ``path``; call with ``path_lock(path)`` held.

    If a crash struck between moving the old output aside and moving the new one in, the old output
    is put back first, so a killed run never costs the previous good output.
    """
    path = Path(path)
    if not path.parent.is_dir():
        return []
    pattern = _temp_re(path.name)
    mine = f".{path.name}.{os.getpid()}-"  # this process's own (a nested writer of the same path)
    stale = [p for p in path.parent.iterdir() if pattern.match(p.name) and not p.name.startswith(mine)]
    for p in stale:
        old = p / _OLD
        if not os.path.lexists(path) and os.path.lexists(old):
            os.rename(old, path)
            log.warning("%s: restored the previous output from an interrupted replacement", path)
        _remove(p)
    if stale:
        log.info("%s: removed %d leftover(s) of killed runs", path.parent, len(stale))
    return stale


def clean_stale_temps_in(directory: str | Path) -> list[Path]:
    """Remove the leftovers of killed writers of every output in ``directory`` that nobody is writing now.

    :func:`atomic_path` cleans a path's leftovers when that path is written again; an output that never
    is (a checkpoint of an earlier step, after a resume) would keep a dead writer's temp for good.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    names = sorted({m.group(1) for p in directory.iterdir() if (m := _ANY_TEMP.match(p.name))})
    removed: list[Path] = []
    for name in names:
        with path_lock(directory / name, wait=False) as held:
            if held:  # a live writer holds its lock: its temp is work in progress
                removed += clean_stale_temps(directory / name)
    return removed


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically (both must exist); False where the platform cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_path(new: Path, path: Path, aside: Path) -> None:
    """Move ``new`` onto ``path`` with no moment where ``path`` is missing (``aside``: a free name in
    the same directory for the fallback)."""
    # a file onto a file is one atomic rename; anything involving a directory needs the exchange
    if os.path.lexists(path) and ((os.path.isdir(path) and not os.path.islink(path)) or os.path.isdir(new)):
        if _exchange(new, path):
            _remove(new)  # now holds the previous output
            return
        os.rename(path, aside)  # fallback: a kill right here is repaired by clean_stale_temps
        try:
            os.replace(new, path)
        except BaseException:
            os.rename(aside, path)  # put the previous output back before the temp dir is deleted
            raise
        return
    os.replace(new, path)


@contextlib.contextmanager
def atomic_path(path: str | Path, owned: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; move it onto ``path`` only if the block succeeds.

    Works for files and directories (whatever the block creates at the temporary path). The block
    runs under ``path``'s writer lock, after leftovers of killed runs are removed.

    ``owned``: the block makes a directory, and an existing directory at ``path`` may be replaced only if
    ``owned(path)`` (or it is empty); checked before the block runs. Without it a file output refuses an
    existing directory once the block has made a file, and a directory output is checked as :func:`check_swap`
    says (commands check their file outputs before any work: ``dpr.cli.common.report_errors``).
    Refusals are :class:`OutputConflictError`, with nothing on disk changed.
    """
    path = Path(path)
    if owned is not None:
        check_replaceable(path, directory=True, owned=owned)
    check_outputs_inside(path.parent, [path.name])  # the user's README.md, metrics.jsonl ... in an output dir
    path.parent.mkdir(parents=True, exist_ok=True)
    with path_lock(path):
        clean_stale_temps(path)
        tmp = path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        try:
            tmp.mkdir()
        except OSError as err:  # name the output, not the temporary name the user never chose
            if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            raise OutputNotWritableError(f"{path.parent}: cannot write {path.name} there "
                                         f"({os.strerror(err.errno).lower()})") from None
        target = tmp / path.name
        try:
            yield target
            if owned is None:
                check_swap(target, path)
            replace_path(target, path, tmp / _OLD)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:  # a file system without hard links
        shutil.copy2(src, dst, follow_symlinks=False)


def carry_over(old: str | Path, new: str | Path, ours: Iterable[str]) -> list[str]:
    """Give ``new`` (a directory about to replace ``old``) every entry of ``old`` not named in ``ours`` (the
    entries the writer made there before): the user's own files, which a rebuild must not delete. Hard links
    (copies where the file system has none), so ``old`` keeps them until the swap and a kill before it loses
    nothing. An entry of the user's that the new directory also has is refused (:class:`OutputConflictError`,
    nothing changed). Returns the names carried."""
    old, new = Path(old), Path(new)
    if not _is_real_dir(old):
        return []
    ours = set(ours)
    carried = []
    for entry in sorted(os.listdir(old)):
        if entry in ours or _ANY_TEMP.match(entry):
            continue
        src, dst = old / entry, new / entry
        if os.path.lexists(dst):
            raise OutputConflictError(src, "is not an output recorded by the earlier build, and the new build "
                                      "writes one of that name")
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif src.is_dir():
            shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(src), str(dst))
        carried.append(entry)
    if carried:
        log.info("%s: kept %d file(s) of yours the rebuild does not write: %s", old, len(carried),
                 ", ".join(carried[:5]) + (" ..." if len(carried) > 5 else ""))
    return carried


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """``obj`` as the project writes JSON (UTF-8, not ASCII-escaped, a final newline), straight to ``path``: for a
    path that is already a temporary one (a member of `dpr.output_sets.atomic_paths`)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=indent)
        f.write("\n")


def write_json_atomic(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    with atomic_path(path) as tmp:
        write_json(tmp, obj, indent)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def nearest_existing(path: str | Path) -> Path:
    """The nearest path above ``path`` that exists (a new output is created in it, or in what is made below it)."""
    probe = Path(path).parent
    while not os.path.lexists(probe):
        probe = probe.parent
    return probe


def create_error(directory: str | Path) -> OSError | None:
    """Why a new file cannot be made in ``directory``, found by making (and removing) one for real: ``os.access``
    lies for root, who ignores permission bits but not a read-only file system. None when it can."""
    try:
        fd, name = tempfile.mkstemp(prefix=".dpr-write-check.", dir=directory)
        os.close(fd)
        os.unlink(name)
    except OSError as err:
        return err
    return None


def check_can_write(path: str | Path) -> None:
    """Before long work: :class:`OutputNotWritableError` (one line naming the directory) unless an output at
    ``path`` can be written, i.e. the nearest existing directory above it takes a new entry; NotADirectoryError
    when that nearest existing path is a file. The write itself goes aside in ``path``'s directory
    (:func:`atomic_path`), so the check is there."""
    path = Path(os.path.abspath(path))
    probe = nearest_existing(path)
    if not os.path.isdir(probe):
        raise NotADirectoryError(f"{path}: cannot be created, {probe} is not a directory")
    err = create_error(probe)
    if err is not None:
        raise OutputNotWritableError(f"{probe}: cannot write {path.relative_to(probe)} there "
                                     f"({os.strerror(err.errno).lower() if err.errno else err})")
