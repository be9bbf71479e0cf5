"""Questions with answer strings in DPR's QA TSV layout: ``question<TAB>["answer", ...]``, no header.

Answers are a JSON list; DPR's published *.qa.csv files write a Python literal (``['a', "b's"]``),
which is accepted too. CRLF line endings are accepted.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Iterable, NamedTuple

from dpr.atomic import atomic_path
from dpr.data._io import iter_lines
from dpr.data._tsv import clean_field, unquote_field
from dpr.errors import DataError


class QAPair(NamedTuple):
    question: str
    answers: list[str]


def parse_answers(raw: str, path: str | Path, lineno: int | str) -> list[str]:
    """Parse a JSON (or Python-literal) list of non-empty answer strings."""
    raw = unquote_field(raw.strip())
    try:
        answers = json.loads(raw)
    except RecursionError:
        raise DataError(path, "answers nested too deeply", line=lineno, field="answers") from None
    except json.JSONDecodeError:
        try:
            answers = ast.literal_eval(raw)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise DataError(path, f"not a JSON list of strings: {raw[:60]!r}", line=lineno, field="answers") from None
    if not isinstance(answers, list):
        raise DataError(path, f"expected a list of strings, got {type(answers).__name__}", line=lineno, field="answers")
    if not answers:
        raise DataError(path, "empty answer list", line=lineno, field="answers")
    for i, a in enumerate(answers):
        if not isinstance(a, str) or not a.strip():
            raise DataError(path, f"answer {i} is not a non-empty string: {a!r}", line=lineno, field="answers")
    return answers


def read_qa_tsv(path: str | Path) -> list[QAPair]:
    """Read and validate a QA TSV: two fields per line, non-empty question, non-empty answer list."""
    path = Path(path)
    pairs: list[QAPair] = []
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            raise DataError(path, f"expected 2 tab-separated fields (question, answers), got {len(parts)}", line=lineno, field="question")
        question = unquote_field(parts[0]).strip()
        if not question:
            raise DataError(path, "empty", line=lineno, field="question")
        pairs.append(QAPair(question, parse_answers(parts[1], path, lineno)))
    return pairs


def write_qa_tsv(path: str | Path, pairs: Iterable[QAPair | tuple[str, list[str]]]) -> int:
    """Write ``(question, answers)`` pairs atomically; returns the count. Answers are written as a JSON
    list (JSON escapes tabs and line breaks); those in the question become spaces."""
    path = Path(path)
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for question, answers in pairs:
            if not question.strip():
                raise DataError(path, "empty", line=f"row {n}", field="question")
            if not answers or not all(isinstance(a, str) and a.strip() for a in answers):
                raise DataError(path, f"answers must be a non-empty list of non-empty strings, got {answers!r}", line=f"row {n}", field="answers")
            f.write(f"{clean_field(question.strip())}\t{json.dumps(list(answers), ensure_ascii=False)}\n")
            n += 1
    return n
