"""`dpr.index.shard_alloc.VectorWriter`: a shard's ``.npy`` written chunk by chunk with ``pwrite`` holds the bytes
the memory-mapped write gave (header and rows), and a chunk that does not fit the shard is refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpr.index.shard_alloc import VectorWriter


def _through_the_map(path, rows: np.ndarray) -> bytes:
    vectors = np.lib.format.open_memmap(path, mode="w+", dtype=rows.dtype, shape=rows.shape)
    vectors[:] = rows
    vectors.flush()
    del vectors
    return path.read_bytes()


@settings(max_examples=30)
@given(count=st.integers(1, 300), dim=st.integers(1, 40), dtype=st.sampled_from(["float16", "float32"]),
       chunk=st.integers(1, 64), seed=st.integers(0, 2 ** 16))
def test_rows_written_in_chunks_are_the_file_the_map_wrote(tmp_path_factory, count, dim, dtype, chunk, seed):
    tmp = tmp_path_factory.mktemp("w")
    rows = np.random.default_rng(seed).standard_normal((count, dim)).astype(dtype)
    order = np.random.default_rng(seed + 1).permutation(range(0, count, chunk))  # chunks in any order
    with VectorWriter(tmp / "a.npy", count, dim, np.dtype(dtype), 0) as w:
        for a in order:
            w.write(int(a), rows[a:a + chunk])
    assert (tmp / "a.npy").read_bytes() == _through_the_map(tmp / "b.npy", rows)
    assert np.array_equal(np.load(tmp / "a.npy"), rows)


def test_an_empty_shard_is_a_loadable_empty_array(tmp_path):
    with VectorWriter(tmp_path / "e.npy", 0, 8, np.dtype("float16"), 3) as w:
        w.write(0, np.zeros((0, 8), dtype="float16"))
    assert np.load(tmp_path / "e.npy").shape == (0, 8)


@pytest.mark.parametrize("row, rows", [(3, np.zeros((2, 4), "float32")),  # past the end
                                       (-1, np.zeros((1, 4), "float32")),
                                       (0, np.zeros((1, 5), "float32")),  # another size
                                       (0, np.zeros((1, 4), "float16"))])  # another dtype
def test_rows_that_do_not_fit_the_shard_are_refused(tmp_path, row, rows):
    with VectorWriter(tmp_path / "v.npy", 4, 4, np.dtype("float32"), 0) as w:
        with pytest.raises(ValueError, match=r"do not fit the shard \[4, 4\] float32"):
            w.write(row, rows)


def test_the_file_is_closed_after_an_error_inside(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with VectorWriter(tmp_path / "v.npy", 4, 4, np.dtype("float32"), 0) as w:
            raise RuntimeError("boom")
    assert w._fd is None
