"""A row range of the passages' Arrow copy (`dpr.data.passages.load_passages`), read chunk by chunk with ``read()``
instead of through the memory map.

Every page of a memory map that a process has read stays in its resident set (VmRSS) until the map is closed: an
encode that walks a 5M-passage corpus through ``ds[a:b]`` ends holding the whole ~2.3 GB Arrow file. Read with
``read()``, the file's bytes go through the kernel's page cache, which the kernel may drop at any time, and the
process holds one Arrow record batch and one chunk of rows at a time however big the corpus is.

`passage_source` keeps what a read needs (the Arrow file and its row count), so the caller can let go of the
memory-mapped dataset; `iter_chunks` yields the rows exactly as ``ds[a:b]`` gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import datasets

Rows = dict[str, list]  # column name -> the chunk's values, as ``ds[a:b]`` gives them


@dataclass(frozen=True)
class PassageSource:
    """Where a passage dataset's rows are: its Arrow stream file, or (anything else) the dataset itself."""

    rows: int
    arrow_file: Path | None  # the one Arrow stream file the dataset is, unchanged; None: read through ``dataset``
    dataset: Any = None  # kept only when there is no such file


def passage_source(ds: "datasets.Dataset") -> PassageSource:
    """The Arrow file behind ``ds`` where ``ds`` is exactly that file's rows in order (one memory-mapped file, no
    transform or index mapping on top: what `load_passages` returns); otherwise the dataset itself."""
    from datasets.table import MemoryMappedTable

    table = ds.data
    # replays: the transforms datasets applies on top of the file; a schema's metadata changes no row
    plain = isinstance(table, MemoryMappedTable) and ds._indices is None and \
        all(op == "replace_schema_metadata" for op, *_ in table.replays)
    if plain and Path(table.path).is_file():
        return PassageSource(len(ds), Path(table.path))
    return PassageSource(len(ds), None, ds)


def iter_chunks(source: PassageSource, start: int, end: int, chunk_size: int) -> Iterator[tuple[int, Rows]]:
    """``(a, rows)`` for consecutive chunks ``[a, min(a + chunk_size, end))`` of rows ``[start, end)``: ``rows`` is
    what ``ds[a:b]`` gives (column name -> list of values)."""
    if not 0 <= start <= end <= source.rows:
        raise ValueError(f"rows [{start}, {end}) are not within the {source.rows} passages")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if source.arrow_file is None:
        for a in range(start, end, chunk_size):
            yield a, source.dataset[a:min(a + chunk_size, end)]
        return
    yield from _read_chunks(source.arrow_file, start, end, chunk_size)


def _read_chunks(path: Path, start: int, end: int, chunk_size: int) -> Iterator[tuple[int, Rows]]:
    """The Arrow stream file's rows ``[start, end)`` in chunks, its record batches read one at a time (those before
    ``start`` are read and dropped: a stream file has no index of where its batches begin)."""
    import pyarrow as pa

    pending: list = []  # record batch slices of the current chunk
    have, a, row = 0, start, 0  # rows in pending; first row of the current chunk; first row of the next batch
    with pa.OSFile(str(path), "rb") as f:
        reader = pa.ipc.open_stream(f)
        for batch in reader:
            lo, hi = max(start, row), min(end, row + batch.num_rows)
            if lo < hi:
                part = batch.slice(lo - row, hi - lo)
                while len(part):
                    take = min(chunk_size - have, len(part))
                    pending.append(part.slice(0, take))
                    part, have = part.slice(take), have + take
                    if have == chunk_size:
                        yield a, _to_rows(pending)
                        pending, a, have = [], a + have, 0
            row += batch.num_rows
            if row >= end:
                break
    if have:
        yield a, _to_rows(pending)
        a += have
    if a != end:
        raise ValueError(f"{path}: the Arrow file holds {row} rows, fewer than {end}")


def _to_rows(batches: list) -> Rows:
    import pyarrow as pa

    return pa.Table.from_batches(batches).to_pydict()
