"""`dpr.data.unique_ids.UniqueIds`: the compact duplicate-id check names the same first repeated line as a set of
every id would, whatever the block size, and a hash shared by two different ids fails nothing."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dpr.data.passages import iter_passages, write_passages
from dpr.data.unique_ids import UniqueIds
from dpr.errors import DataError


class _Colliding(UniqueIds):
    """Hashes with few values: most ids share one with another id, so every repeat is a confirmed candidate."""

    def _hashes(self) -> np.ndarray:
        return np.fromiter((len(p) % 3 for p in self._recent), dtype=np.int64, count=len(self._recent))


def _first_repeat(ids: list[str]) -> int | None:
    """The line (header = line 1) of the first id that occurred before: what a set of every id finds."""
    seen: set[str] = set()
    for row, pid in enumerate(ids):
        if pid in seen:
            return row + 2
        seen.add(pid)
    return None


def _check(kind: type[UniqueIds], path: Path, ids: list[str], block: int) -> int | None:
    check = kind(path, block=block)
    try:
        for row, pid in enumerate(ids):
            check.add(pid, row + 2)
        check.finish()
    except DataError as err:
        assert err.field == "id" and f"duplicate passage id {ids[err.line - 2]!r}" in str(err)
        return err.line
    return None


@settings(max_examples=60)
@given(ids=st.lists(st.text(alphabet="abcdé", min_size=1, max_size=4), max_size=80), block=st.integers(1, 9),
       kind=st.sampled_from([UniqueIds, _Colliding]))
@example(ids=["a", "b", "x", "a", "c", "c"], block=3, kind=UniqueIds)  # an older id's repeat before a block's own
def test_the_first_repeated_line_is_the_one_a_set_finds(ids, block, kind):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.tsv"
        write_passages(path, [(pid, "text", "") for pid in ids])
        assert _check(kind, path, ids, block) == _first_repeat(ids)


def test_ids_that_only_share_a_hash_pass(tmp_path):
    ids = [f"p{i}" for i in range(40)]  # distinct; _Colliding gives them 3 hashes between them
    write_passages(tmp_path / "p.tsv", [(pid, "t", "") for pid in ids])
    assert _check(_Colliding, tmp_path / "p.tsv", ids, 4) is None


def test_iter_passages_names_a_repeat_from_far_back(tmp_path):
    ids = [f"p{i}" for i in range(70_000)] + ["p5"]  # the repeat's first occurrence is a block earlier
    write_passages(tmp_path / "p.tsv", [(pid, "t", "") for pid in ids])
    with pytest.raises(DataError, match="duplicate passage id 'p5'") as err:
        list(iter_passages(tmp_path / "p.tsv"))
    assert err.value.line == 70_002 and err.value.field == "id"
    assert len(list(iter_passages(tmp_path / "p.tsv", check_unique=False))) == 70_001
