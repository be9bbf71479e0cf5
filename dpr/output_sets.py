"""Outputs that are one set of files (a report and its markdown, a reranked list and its stats): written aside,
moved in with a manifest last that names every other member by size and hash, and checked on read, so a writer
killed between two moves leaves a set that is refused in one line rather than read mixed."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from dpr.atomic import atomic_path, check_swap, sha256_file
from dpr.errors import DataError


@contextlib.contextmanager
def atomic_paths(paths: Iterable[str | Path]) -> Iterator[list[Path]]:
    """Temporary paths for several outputs that make one set (`dpr.atomic.atomic_path` for each, one writer lock each).
    Nothing is moved unless the block succeeds and every temporary may replace its output; then they are moved
    in the order given, one rename each, so a failure while writing (a full disk, bad input) leaves the previous
    set as it was. Give a manifest last (:func:`file_manifest` of the others, checked on read with
    :func:`check_file_manifest`): a kill between two renames then leaves a set its manifest does not name."""
    paths = [Path(p) for p in paths]
    if len({os.path.abspath(p) for p in paths}) != len(paths):
        raise ValueError(f"one output named twice in {[str(p) for p in paths]}")
    with contextlib.ExitStack() as stack:
        # entered last-first: the stack leaves (and renames) the first one first, the manifest last
        tmps = [stack.enter_context(atomic_path(p)) for p in reversed(paths)][::-1]
        yield tmps
        for tmp, path in zip(tmps, paths):  # before any rename: a refusal of the last one changes nothing either
            check_swap(tmp, path)


def file_manifest(files: Mapping[str, str | Path]) -> dict[str, dict]:
    """``{name: {"bytes", "sha256"}}`` of small files (read whole): what a set's manifest records of its members
    (``files``: each member's name as the manifest calls it -> where it is now, e.g. its temporary path)."""
    return {name: {"bytes": os.path.getsize(p), "sha256": sha256_file(p)} for name, p in files.items()}


def check_file_manifest(manifest: str | Path, recorded: Any, directory: str | Path, remedy: str) -> None:
    """DataError (one line, naming the file) unless each file ``recorded`` names (a :func:`file_manifest` read from
    ``manifest``) is in ``directory`` with that size and hash: a set whose writer was killed between its renames,
    or a member copied in from another run. ``recorded`` None: a set written before manifests, taken as it is.
    ``remedy``: what to run to write the set again."""
    if recorded is None:
        return
    if not isinstance(recorded, Mapping):
        raise DataError(manifest, "not a mapping of file names to sizes and hashes", field="files")
    for name, want in sorted(recorded.items()):
        path = Path(directory) / str(name)
        if not path.is_file():
            raise DataError(path, f"missing, and {Path(manifest).name} names it as part of its output; {remedy}",
                            field="files")
        if file_manifest({name: path})[name] != want:
            raise DataError(path, f"not the file {Path(manifest).name} was written with (the two are from different "
                            f"runs: one was interrupted, or a file was copied in); {remedy}", field="files")
