"""NQ-open JSON lines: one ``{"question": str, "answer": [str, ...]}`` per line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from dpr.atomic import atomic_path
from dpr.data._io import get_str, get_str_list, iter_jsonl
from dpr.data.qa import QAPair
from dpr.errors import DataError


def read_nq_open(path: str | Path) -> list[QAPair]:
    """Read and validate NQ-open JSONL into `QAPair`s (question non-empty, answer a non-empty list)."""
    path = Path(path)
    return [
        QAPair(get_str(path, obj, "question", ln).strip(), get_str_list(path, obj, "answer", ln, nonempty=True))
        for ln, obj in iter_jsonl(path)
    ]


def write_nq_open(path: str | Path, pairs: Iterable[QAPair | tuple[str, list[str]]]) -> int:
    path = Path(path)
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for question, answers in pairs:
            if not question.strip() or not answers:
                raise DataError(path, "empty question or answer list", line=f"row {n}", field="question")
            f.write(json.dumps({"question": question, "answer": list(answers)}, ensure_ascii=False) + "\n")
            n += 1
    return n
