"""Space for one shard's vectors before they are written: a ``.npy`` whose every block is allocated up front
(`reserve_space`), so a full disk is one OSError naming the shard, never a SIGBUS in the middle of a write through
a map. `VectorWriter` then writes each chunk's rows at their place with ``pwrite``: written through a memory map,
every page of the shard would stay in the process's resident set until the end (a 5M × 768 float16 shard: 7.7 GB);
written with ``pwrite`` they go to the kernel's page cache, which it flushes and drops as it needs. Used by
`dpr.encode.encode_corpus`."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np


def open_vectors(path: Path, count: int, dim: int, np_dtype: np.dtype, shard: int) -> np.memmap | None:
    """A ``count × dim`` memory-mapped ``.npy`` at ``path`` with its space reserved (`reserve_space`), or None for
    an empty shard (more shards than passages: written whole, numpy cannot memory-map 0 bytes)."""
    if not count:
        with open(path, "wb") as f:
            np.save(f, np.zeros((0, dim), dtype=np_dtype))
        return None
    vectors = np.lib.format.open_memmap(path, mode="w+", dtype=np_dtype, shape=(count, dim))
    try:
        reserve_space(path, shard, vectors.offset)  # before the first write through the map
    except OSError:
        del vectors
        path.unlink(missing_ok=True)
        raise
    return vectors


class VectorWriter:
    """``with VectorWriter(path, count, dim, dtype, shard) as w: w.write(row, rows)``: the ``count × dim`` ``.npy``
    at ``path`` (the header and size `open_vectors` gives, its space reserved), each ``write`` putting ``rows`` at
    row ``row``; synced to disk on a clean exit, as the map's flush did."""

    def __init__(self, path: Path, count: int, dim: int, np_dtype: np.dtype, shard: int) -> None:
        self.dtype, self.count, self.dim = np.dtype(np_dtype), count, dim
        self.row_bytes = dim * self.dtype.itemsize
        vectors = open_vectors(path, count, dim, np_dtype, shard)  # the header and reserved space; no page touched
        self.offset = 0 if vectors is None else int(vectors.offset)
        del vectors  # unmapped: the rows go through the file
        self._fd = os.open(path, os.O_WRONLY) if count else None

    def write(self, row: int, rows: np.ndarray) -> None:
        """Rows ``[row, row + len(rows))`` of the shard."""
        if rows.dtype != self.dtype or rows.shape[1:] != (self.dim,) or row < 0 or row + len(rows) > self.count:
            raise ValueError(f"rows {list(rows.shape)} {rows.dtype} at row {row} do not fit the shard "
                             f"[{self.count}, {self.dim}] {self.dtype}")
        if not len(rows):
            return
        data = memoryview(np.ascontiguousarray(rows)).cast("B")
        at = self.offset + row * self.row_bytes
        while len(data):  # pwrite may write less than asked
            done = os.pwrite(self._fd, data, at)
            data, at = data[done:], at + done

    def __enter__(self) -> "VectorWriter":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self._fd is None:
            return
        try:
            if exc_type is None:
                os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = None


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def reserve_space(path: Path, shard: int, data_start: int = 0) -> None:
    """Allocate every block of the (sparse) memory-mapped shard file ``path`` now. A write through a map into a
    block the full disk cannot give is SIGBUS, which kills the process without a word; a failed reservation is
    an OSError here, naming the shard, with the finished shards kept for the same command to resume. A file
    system without ``posix_fallocate`` gets the zeros of the data (from ``data_start``, after the header) written
    through the file instead (ENOSPC likewise)."""
    size = path.stat().st_size
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as err:
                if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                block = b"\0" * (1 << 20)
                for start in range(data_start, size, len(block)):
                    os.pwrite(fd, block[: min(len(block), size - start)], start)
        finally:
            os.close(fd)
    except OSError as err:
        if err.errno in _NO_SPACE:
            raise OSError(f"{path.parent}: no space left on the device for shard {shard}'s vectors ({size} bytes); "
                          "free space and run the same command again (finished shards are kept)") from None
        raise
