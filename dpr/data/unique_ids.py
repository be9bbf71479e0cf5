"""The duplicate-id check of a streamed passages file in 8 bytes an id instead of a set of every id.

A set of 21M passage ids as Python strings holds ~2 GB (each a ~60-byte string plus its slot); `UniqueIds` keeps
the ids of the last block of lines exactly (a dict) and only a 64-bit hash of each earlier id, in sorted numpy
arrays (a few sorted runs of doubling sizes, merged as they fill). A hash found among the earlier ones is confirmed
by reading the file's earlier lines again, so a collision of two different ids never fails a file: the error
names exactly the first line whose id occurred before, as a set would. It is raised at that line or, for a
repeat of an id from an earlier block, when the block ends (within `BLOCK` lines of it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpr.data._io import iter_lines
from dpr.errors import DataError

BLOCK = 1 << 16  # ids held exactly (~10 MB); a repeat of an older id is found at the end of its block


class UniqueIds:
    """``check = UniqueIds(path); check.add(pid, lineno)`` per passage, ``check.finish()`` after the last: a
    `DataError` (file, line, field ``id``) at the first line whose id occurred on an earlier line."""

    def __init__(self, path: str | Path, block: int = BLOCK) -> None:
        self.path, self.block = Path(path), block
        self._recent: dict[str, int] = {}  # id -> line, this block
        self._runs: list[np.ndarray] = []  # sorted hashes of the earlier blocks' ids, largest run first

    def add(self, pid: str, lineno: int) -> None:
        if pid in self._recent:
            self._check_older()  # a repeat of an older id on an earlier line of this block is the first one
            raise DataError(self.path, f"duplicate passage id {pid!r}", line=lineno, field="id")
        self._recent[pid] = lineno
        if len(self._recent) >= self.block:
            self._end_block()

    def finish(self) -> None:
        self._end_block()

    def _hashes(self) -> np.ndarray:
        return np.fromiter((hash(p) for p in self._recent), dtype=np.int64, count=len(self._recent))

    def _check_older(self) -> None:
        """Raise for the first id of this block that an earlier block had (confirmed on the file's lines)."""
        if not self._runs or not self._recent:
            return
        hashes = self._hashes()
        seen = np.zeros(len(hashes), dtype=bool)
        for run in self._runs:
            at = np.minimum(np.searchsorted(run, hashes), len(run) - 1)
            seen |= run[at] == hashes
        if seen.any():
            ids = list(self._recent)
            self._confirm({ids[i]: self._recent[ids[i]] for i in np.flatnonzero(seen)})

    def _confirm(self, candidates: dict[str, int]) -> None:
        """Read the lines before this block: the candidates that really occurred there are repeats; the first one
        (by line) is the error. Candidates whose hash only collided pass."""
        first = min(self._recent.values())
        repeated = []
        for lineno, line in iter_lines(self.path):
            if lineno >= first:
                break
            pid = line.split("\t", 1)[0].strip()
            if lineno > 1 and pid in candidates:
                repeated.append(candidates[pid])
        if repeated:
            line = min(repeated)
            pid = next(p for p, n in candidates.items() if n == line)
            raise DataError(self.path, f"duplicate passage id {pid!r}", line=line, field="id")

    def _end_block(self) -> None:
        self._check_older()
        run = np.sort(self._hashes())
        self._recent.clear()
        while self._runs and len(self._runs[-1]) <= 2 * len(run):  # runs of doubling sizes: log(N) of them
            run = np.sort(np.concatenate([self._runs.pop(), run]), kind="stable")  # two sorted runs: a merge
        if len(run):
            self._runs.append(run)
