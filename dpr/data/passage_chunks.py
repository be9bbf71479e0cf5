"""A row range of the passages' Arrow copy (`dpr.data.passages.load_passages`), read chunk by chunk with ``read()``
instead of through the memory map.

Every page of a memory map that a process has read stays in its resident set (VmRSS) until the map is closed: an
encode that walks a 5M-passage corpus through ``ds[a:b]`` ends holding the whole ~2.3 GB Arrow file. Read with
``read()``, the file's bytes go through the kernel's page cache, which the kernel may drop at any time, and the
process holds one Arrow record batch and one chunk of rows at a time however big the corpus is.

`passage_source` keeps what a read needs (the Arrow files and the row count), so the caller can let go of the
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
    """Where a passage dataset's rows are: its Arrow stream files in order, or (anything else) the dataset itself."""

    rows: int
    arrow_files: tuple[Path, ...]  # the files the dataset is, unchanged; empty: read through ``dataset``
    dataset: Any = None  # kept only when there are no such files


def _plain_file(table: Any) -> Path | None:
    """The file of a memory-mapped table that is that file's rows unchanged, else None."""
    from datasets.table import MemoryMappedTable

    # replays: the transforms datasets applies on top of the file; a schema's metadata changes no row
    if isinstance(table, MemoryMappedTable) and all(op == "replace_schema_metadata" for op, *_ in table.replays):
        return Path(table.path) if Path(table.path).is_file() else None
    return None


def passage_source(ds: "datasets.Dataset") -> PassageSource:
    """The Arrow files behind ``ds`` where ``ds`` is exactly their rows in order (memory-mapped files one after the
    other, no transform or index mapping on top: what `load_passages` returns, one file or, past datasets' shard
    size, several); otherwise the dataset itself."""
    from datasets.table import ConcatenationTable

    table = ds.data
    if isinstance(table, ConcatenationTable):
        parts = [row[0] if len(row) == 1 else None for row in table.blocks]  # one table a row: stacked files
    else:
        parts = [table]
    files = [_plain_file(t) if t is not None else None for t in parts]
    if ds._indices is None and files and None not in files and sum(t.num_rows for t in parts) == len(ds):
        return PassageSource(len(ds), tuple(files))
    return PassageSource(len(ds), (), ds)


def iter_chunks(source: PassageSource, start: int, end: int, chunk_size: int) -> Iterator[tuple[int, Rows]]:
    """``(a, rows)`` for consecutive chunks ``[a, min(a + chunk_size, end))`` of rows ``[start, end)``: ``rows`` is
    what ``ds[a:b]`` gives (column name -> list of values)."""
    if not 0 <= start <= end <= source.rows:
        raise ValueError(f"rows [{start}, {end}) are not within the {source.rows} passages")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not source.arrow_files:
        for a in range(start, end, chunk_size):
            yield a, source.dataset[a:min(a + chunk_size, end)]
        return
    yield from _read_chunks(source.arrow_files, start, end, chunk_size)


def _batches(paths: tuple[Path, ...]) -> Iterator[Any]:
    """The record batches of the Arrow stream files in order, one read at a time."""
    import pyarrow as pa

    for path in paths:
        with pa.OSFile(str(path), "rb") as f:
            yield from pa.ipc.open_stream(f)


def _read_chunks(paths: tuple[Path, ...], start: int, end: int, chunk_size: int) -> Iterator[tuple[int, Rows]]:
    """The files' rows ``[start, end)`` in chunks (the batches before ``start`` are read and dropped: a stream file
    has no index of where its batches begin)."""
    pending: list = []  # record batch slices of the current chunk
    have, a, row = 0, start, 0  # rows in pending; first row of the current chunk; first row of the next batch
    batches = _batches(paths)
    for batch in batches:
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
    batches.close()  # the open file, now
    if have:
        yield a, _to_rows(pending)
        a += have
    if a != end:
        raise ValueError(f"{', '.join(map(str, paths))}: the Arrow files hold {row} rows, fewer than {end}")


def _to_rows(batches: list) -> Rows:
    import pyarrow as pa

    return pa.Table.from_batches(batches).to_pydict()
