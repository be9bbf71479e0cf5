"""SQuAD v1.1 JSON: ``{"version", "data": [{"title", "paragraphs": [{"context", "qas": [{"id",
"question", "answers": [{"text", "answer_start"}]}]}]}]}``; every answer span is checked against its
context. Errors name the JSON path of the record (e.g. ``data[3].paragraphs[5].qas[2]``)."""

from __future__ import annotations

import json
from pathlib import Path

from dpr.atomic import atomic_path
from dpr.data._io import expect_list, get_list, get_str, load_json_file
from dpr.errors import DataError


def _check_answer(path: Path, ans: object, context: str, where: str) -> dict:
    text = get_str(path, ans, "text", where)
    if "answer_start" not in ans:
        raise DataError(path, "missing", line=where, field="answer_start")
    start = ans["answer_start"]
    if isinstance(start, bool) or not isinstance(start, int):
        raise DataError(path, f"expected an integer, got {type(start).__name__}", line=where, field="answer_start")
    if context[start : start + len(text)] != text:
        raise DataError(
            path,
            f"answer span outside its context: context[{start}:{start + len(text)}] is "
            f"{context[start:start + len(text)][:40]!r}, answer text is {text[:40]!r}",
            line=where,
            field="answer_start",
        )
    return {"text": text, "answer_start": start}


def validate_squad(path: str | Path, obj: object) -> list[dict]:
    """Validate a parsed SQuAD object and return its ``data`` list (articles)."""
    path = Path(path)
    if not isinstance(obj, dict) or "data" not in obj:
        raise DataError(path, "expected an object with a 'data' list", field="data")
    articles = expect_list(path, obj["data"], None, field="data")
    seen_ids: set[str] = set()
    for a, art in enumerate(articles):
        aw = f"record data[{a}]"
        get_str(path, art, "title", aw)
        paragraphs = get_list(path, art, "paragraphs", aw)
        for p, par in enumerate(paragraphs):
            pw = f"{aw}.paragraphs[{p}]"
            context = get_str(path, par, "context", pw)
            for q, qa in enumerate(get_list(path, par, "qas", pw)):
                qw = f"{pw}.qas[{q}]"
                get_str(path, qa, "question", qw)
                qid = get_str(path, qa, "id", qw)
                if qid in seen_ids:
                    raise DataError(path, f"duplicate question id {qid!r}", line=qw, field="id")
                seen_ids.add(qid)
                answers = get_list(path, qa, "answers", qw)
                if not answers:
                    raise DataError(path, "empty list", line=qw, field="answers")
                for k, ans in enumerate(answers):
                    _check_answer(path, ans, context, f"{qw}.answers[{k}]")
    return articles


def read_squad(path: str | Path) -> list[dict]:
    """Read and validate a SQuAD v1.1 file; returns the list of articles (the ``data`` field)."""
    path = Path(path)
    return validate_squad(path, load_json_file(path))


def write_squad(path: str | Path, articles: list[dict], version: str = "1.1") -> None:
    """Write articles as a SQuAD JSON file (validated first, written atomically)."""
    path = Path(path)
    obj = {"version": version, "data": articles}
    validate_squad(path, obj)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)
