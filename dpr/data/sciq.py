"""SciQ JSON: a list of ``{question, correct_answer, distractor1..3, support}``; ``support`` (the
paragraph the question was written from) may be empty."""

from __future__ import annotations

import json
from pathlib import Path

from dpr.atomic import atomic_path
from dpr.data._io import expect_list, get_str, load_json_file, record
from dpr.errors import DataError

FIELDS = ("question", "correct_answer", "distractor1", "distractor2", "distractor3", "support")


def validate_sciq(path: str | Path, obj: object) -> list[dict]:
    path = Path(path)
    items = expect_list(path, obj, None)
    out = []
    for i, item in enumerate(items):
        where = record(i)
        if not isinstance(item, dict):
            raise DataError(path, f"expected an object, got {type(item).__name__}", line=where)
        row = dict(item)
        row["question"] = get_str(path, item, "question", where)
        row["correct_answer"] = get_str(path, item, "correct_answer", where)
        row["support"] = get_str(path, item, "support", where, nonempty=False)
        for d in ("distractor1", "distractor2", "distractor3"):
            row[d] = get_str(path, item, d, where, nonempty=False, required=False)
        out.append(row)
    return out


def read_sciq(path: str | Path) -> list[dict]:
    """Read and validate a SciQ split file (question and correct_answer non-empty, support a string)."""
    path = Path(path)
    return validate_sciq(path, load_json_file(path))


def write_sciq(path: str | Path, items: list[dict]) -> None:
    path = Path(path)
    validate_sciq(path, items)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(items, f, ensure_ascii=False)
