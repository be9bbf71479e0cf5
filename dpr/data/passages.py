"""Passage collections in DPR's TSV layout (``id<TAB>text<TAB>title`` with a header line).

``iter_passages`` streams and validates (a 21M-passage corpus never becomes a Python list);
``load_passages`` gives an Arrow-backed, memory-mapped `datasets.Dataset` for random access.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping

from dpr.atomic import atomic_path
from dpr.data._io import iter_lines
from dpr.data._tsv import clean_field, unquote_field
from dpr.data.unique_ids import UniqueIds
from dpr.errors import DataError

if TYPE_CHECKING:  # datasets is slow to import; only load_passages needs it
    import datasets

log = logging.getLogger(__name__)

HEADER = ("id", "text", "title")


def iter_passages(path: str | Path, check_unique: bool = True) -> Iterator[dict]:
    """Yield ``{"id", "text", "title"}`` per passage, validating as it goes.

    Rejected with a `DataError` (file, line, field): a header other than ``id, text, title``, a line
    without exactly three tab-separated fields, an empty id or text, a duplicate id
    (`dpr.data.unique_ids`: 8 bytes an id, the repeat of an id from more than 65,536 lines earlier found
    within 65,536 lines of it; ``check_unique=False`` skips it for a trusted corpus), non-UTF-8 bytes.
    Titles may be empty. CRLF line endings are accepted.
    """
    path = Path(path)
    unique = UniqueIds(path) if check_unique else None
    lines = iter_lines(path)
    first = next(lines, None)
    if first is None:
        raise DataError(path, "empty file: expected the header 'id<TAB>text<TAB>title'", line=1, field="header")
    header = tuple(h.strip() for h in first[1].split("\t"))
    if header != HEADER:
        raise DataError(path, f"expected header 'id<TAB>text<TAB>title', got {first[1][:80]!r}", line=1, field="header")
    for lineno, line in lines:
        if not line.strip():
            continue  # a trailing blank line is harmless
        parts = line.split("\t")
        if len(parts) != 3:
            raise DataError(path, f"expected 3 tab-separated fields (id, text, title), got {len(parts)}", line=lineno, field="id")
        pid, text, title = parts[0].strip(), unquote_field(parts[1]), unquote_field(parts[2])
        if not pid:
            raise DataError(path, "empty", line=lineno, field="id")
        if not text.strip():
            raise DataError(path, f"empty text for passage {pid!r}", line=lineno, field="text")
        if unique is not None:
            unique.add(pid, lineno)
        yield {"id": pid, "text": text, "title": title}
    if unique is not None:
        unique.finish()


def write_passages(path: str | Path, rows: Iterable[Mapping[str, str] | tuple[str, str, str]]) -> int:
    """Write passages (dicts with id/text/title, or ``(id, text, title)`` tuples) atomically; returns the count.

    Tabs and line breaks inside text/title become spaces (see `dpr.data._tsv.clean_field`); an id with
    one, an empty id or an empty text is refused, so whatever we write reads back.
    """
    path = Path(path)
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write("\t".join(HEADER) + "\n")
        for row in rows:
            pid, text, title = (row["id"], row["text"], row.get("title", "")) if isinstance(row, Mapping) else row
            pid = str(pid)
            where = f"row {n}"
            if not pid.strip() or any(c in pid for c in "\t\r\n"):
                raise DataError(path, f"invalid passage id {pid!r}", line=where, field="id")
            if not isinstance(text, str) or not text.strip():
                raise DataError(path, f"empty text for passage {pid!r}", line=where, field="text")
            f.write(f"{pid}\t{clean_field(text)}\t{clean_field(title or '')}\n")
            n += 1
    return n


def _passage_generator(path: str, mtime_ns: int, size: int) -> Iterator[dict]:
    # mtime_ns and size are unused here: they are in gen_kwargs so that datasets' cache fingerprint
    # changes when the file does (the fingerprint hashes the generator and its kwargs).
    del mtime_ns, size
    yield from iter_passages(path)


def _data_error_in(err: BaseException) -> DataError | None:
    """The `DataError` somewhere in ``err``'s chain of causes, if any."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, DataError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def load_passages(path: str | Path, cache_dir: str | Path | None = None) -> "datasets.Dataset":
    """An Arrow-backed `datasets.Dataset` (columns id, text, title), memory-mapped from disk.

    Built once by streaming `iter_passages` and cached in ``cache_dir`` (default: datasets' own cache,
    ``$HF_DATASETS_CACHE``), keyed by the file's absolute path, mtime and size: editing the file
    rebuilds it.
    """
    import datasets

    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"passages file not found: {path}")
    st = path.stat()
    features = datasets.Features({k: datasets.Value("string") for k in HEADER})
    try:
        ds = datasets.Dataset.from_generator(
            _passage_generator,
            features=features,
            cache_dir=str(cache_dir) if cache_dir is not None else None,
            gen_kwargs={"path": str(path), "mtime_ns": st.st_mtime_ns, "size": st.st_size},
        )
    except Exception as err:  # datasets wraps the reader's DataError in a DatasetGenerationError
        cause = _data_error_in(err)
        if cause is None:
            raise
        raise cause from None
    log.info("loaded %d passages from %s (Arrow cache %s)", len(ds), path, ds.cache_files[0]["filename"] if ds.cache_files else "in memory")
    return ds


def passage_index(ds: "datasets.Dataset") -> dict[str, int]:
    """Map passage id → row number in ``ds`` (reads only the id column)."""
    return {pid: i for i, pid in enumerate(ds["id"])}


class PassageLookup:
    """Random access to passages by id over an Arrow dataset: ``lookup["p1"] -> {"id", "text", "title"}``."""

    def __init__(self, ds: "datasets.Dataset") -> None:
        self.ds = ds
        self.row_of = passage_index(ds)

    @classmethod
    def from_file(cls, path: str | Path, cache_dir: str | Path | None = None) -> "PassageLookup":
        return cls(load_passages(path, cache_dir=cache_dir))

    def __len__(self) -> int:
        return len(self.row_of)

    def __contains__(self, pid: object) -> bool:
        return pid in self.row_of

    def __getitem__(self, pid: str) -> dict:
        return self.ds[self.row_of[pid]]

    def get(self, pid: str, default: dict | None = None) -> dict | None:
        row = self.row_of.get(pid)
        return default if row is None else self.ds[row]


def count_passages(path: str | Path) -> int:
    """Number of passages (data lines) without validating: a quick size check for progress bars."""
    with open(path, "rb") as f:
        n = sum(1 for line in f if line.strip())
    return max(n - 1, 0)


__all__ = ["iter_passages", "write_passages", "load_passages", "passage_index", "PassageLookup", "count_passages", "HEADER"]
