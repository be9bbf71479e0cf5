"""Space for one shard's vectors before they are written: a memory-mapped ``.npy`` whose every block is allocated
up front (`reserve_space`), so a full disk is one OSError naming the shard, never a SIGBUS in the middle of a write
through the map. Used by `dpr.encode.encode_corpus`."""

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
