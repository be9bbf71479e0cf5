"""Passage texts for retrieved ids: the one place retrieval turns passage ids into titles and texts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from dpr.errors import DataError

if TYPE_CHECKING:
    import datasets


class PassageStore:
    """The Arrow-backed (memory-mapped) passages of a ``passages.tsv``, looked up by id.

    Lookups are one vectorised scan of the Arrow id column per call (no id → row dict over the whole
    corpus, which for 21M passages would cost gigabytes), so callers batch their ids.
    """

    def __init__(self, passages: "str | Path | datasets.Dataset", cache_dir: str | Path | None = None) -> None:
        if isinstance(passages, (str, Path)):
            from dpr.data.passages import load_passages

            self.path: Path | None = Path(passages)
            self.ds = load_passages(passages, cache_dir=cache_dir)
        else:
            self.path, self.ds = None, passages

    def __len__(self) -> int:
        return len(self.ds)

    def fetch(self, ids: Sequence[str]) -> dict[str, dict]:
        """``{id: {"title", "text"}}`` for the distinct ``ids``; an id absent from the file is a `DataError`."""
        import pyarrow as pa
        import pyarrow.compute as pc

        wanted = sorted(set(ids))
        if not wanted:
            return {}
        mask = pc.is_in(self.ds.data.column("id"), value_set=pa.array(wanted, type=pa.string()))
        rows = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
        batch = self.ds.select(rows).to_dict()
        found = {pid: {"title": title, "text": text}
                 for pid, title, text in zip(batch["id"], batch["title"], batch["text"])}
        if len(found) != len(wanted):
            absent = [pid for pid in wanted if pid not in found]
            raise DataError(self.path, f"{len(absent)} retrieved passage ids are not in this passages file, "
                            f"e.g. {absent[0]!r} (index built from another corpus?)", field="id")
        return found

    def fetch_rows(self, rows: np.ndarray, expected_ids: Sequence[str]) -> dict[int, dict]:
        """``{row: {"id", "title", "text"}}`` for the distinct ``rows`` of an index built over this file in
        its order (BM25), checking that row ``r`` still holds ``expected_ids[r]``."""
        wanted = np.unique(rows).tolist()
        if wanted and wanted[-1] >= len(self.ds):
            raise DataError(self.path, f"the index has {len(expected_ids)} passages but the passages file has "
                            f"{len(self.ds)}: rebuild the index", field="id")
        batch = self.ds[wanted]
        out = {}
        for i, row in enumerate(wanted):
            pid = batch["id"][i]
            if pid != expected_ids[row]:
                raise DataError(self.path, f"passage row {row} is {pid!r} in the passages file but "
                                f"{expected_ids[row]!r} in the index: the index is stale, rebuild it", field="id")
            out[row] = {"id": pid, "title": batch["title"][i], "text": batch["text"][i]}
        return out

    def check_order(self, expected_ids: Sequence[str]) -> None:
        """Refuse a passages file whose ids are not ``expected_ids`` in that order (an index over rows,
        like BM25's, built from another version of the file)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        col = self.ds.data.column("id")
        if len(col) != len(expected_ids):
            raise DataError(self.path, f"the index has {len(expected_ids)} passages but the passages file has "
                            f"{len(col)}: rebuild the index", field="id")
        same = pc.equal(col, pa.array(list(expected_ids), type=pa.string()))
        if not pc.all(same).as_py():
            row = int(np.flatnonzero(~same.to_numpy(zero_copy_only=False))[0])
            raise DataError(self.path, f"passage row {row} is {col[row].as_py()!r} in the passages file but "
                            f"{expected_ids[row]!r} in the index: the index is stale, rebuild it", field="id")


def fetch_passages(passages_path: str | Path, ids: Sequence[str],
                   cache_dir: str | Path | None = None) -> dict[str, dict]:
    """``{id: {"title", "text"}}`` for the given ids of a passages file (see `PassageStore.fetch`)."""
    return PassageStore(passages_path, cache_dir=cache_dir).fetch(ids)
