"""A shard's vector file is allocated before any vector is written (`dpr.index.shard_alloc`): its full size on disk,
an empty shard written whole, and a full disk one line naming the shard with nothing left behind."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from dpr.index.shard_alloc import open_vectors


def test_vectors_are_mapped_at_their_full_size(tmp_path):
    path = tmp_path / ".shard.npy.tmp"
    vectors = open_vectors(path, 300, 16, np.dtype("float16"), 0)
    assert vectors.shape == (300, 16) and vectors.dtype == np.float16
    assert os.stat(path).st_blocks * 512 >= 300 * 16 * 2  # allocated now, not sparse
    vectors[:] = 1.5
    vectors.flush()
    del vectors
    np.testing.assert_array_equal(np.load(path), np.full((300, 16), 1.5, dtype=np.float16))


def test_an_empty_shard_is_written_whole(tmp_path):
    path = tmp_path / ".shard.npy.tmp"
    assert open_vectors(path, 0, 8, np.dtype("float32"), 3) is None
    assert np.load(path).shape == (0, 8)


def test_a_full_disk_is_one_line_and_leaves_no_file(tmp_path, monkeypatch):
    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    path = tmp_path / ".shard.npy.tmp"
    with pytest.raises(OSError, match=r"no space left on the device for shard 2's vectors") as err:
        open_vectors(path, 100, 4, np.dtype("float32"), 2)
    assert "\n" not in str(err.value)
    assert not path.exists()
