"""Retrieval results: DPR's results JSON (a list of ``{question, answers, ctxs: [{id, title, text,
score, has_answer}]}``) and TREC run files (``qid Q0 docid rank score tag``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable, Mapping

from dpr.atomic import atomic_path
from dpr.data._io import expect_list, get_id, get_list, get_str, get_str_list, iter_lines, load_json_file, record
from dpr.errors import DataError


def _number(path: Path, obj: dict, key: str, where: str, field: str) -> float:
    if key not in obj:
        raise DataError(path, "missing", line=where, field=field)
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DataError(path, f"expected a number, got {type(v).__name__}", line=where, field=field)
    return float(v)


def validate_result(path: str | Path, res: object, i: int) -> dict:
    """Check one result entry. ``answers`` may be empty (qrels data); ``has_answer`` is optional but
    must be a bool when present; extra keys (e.g. a query id) are kept."""
    path = Path(path)
    where = record(i)
    if not isinstance(res, dict):
        raise DataError(path, f"expected an object, got {type(res).__name__}", line=where)
    out = dict(res)
    out["question"] = get_str(path, res, "question", where)
    out["answers"] = get_str_list(path, res, "answers", where)
    ctxs = []
    for j, c in enumerate(get_list(path, res, "ctxs", where)):
        f = f"ctxs[{j}]"
        if not isinstance(c, dict):
            raise DataError(path, f"expected an object, got {type(c).__name__}", line=where, field=f)
        ctx = dict(c)
        ctx["id"] = get_id(path, c, "id", where, field=f"{f}.id")
        ctx["title"] = get_str(path, c, "title", where, nonempty=False, field=f"{f}.title")
        ctx["text"] = get_str(path, c, "text", where, nonempty=False, field=f"{f}.text")
        ctx["score"] = _number(path, c, "score", where, f"{f}.score")
        if not math.isfinite(ctx["score"]):  # NaN compares false with everything: it would corrupt the ranking
            raise DataError(path, f"score {ctx['score']!r} is not a finite number (question {out['question']!r}, "
                            f"passage {ctx['id']!r})", line=where, field=f"{f}.score")
        if "has_answer" in c:
            # numpy's bool_ is accepted (and stored as a plain bool) since writers often pass one
            if type(c["has_answer"]).__name__ not in ("bool", "bool_"):
                raise DataError(path, f"expected true/false, got {c['has_answer']!r}", line=where, field=f"{f}.has_answer")
            ctx["has_answer"] = bool(c["has_answer"])
        ctxs.append(ctx)
    out["ctxs"] = ctxs
    return out


def read_results(path: str | Path) -> list[dict]:
    """Read and validate a DPR results JSON file."""
    path = Path(path)
    data = expect_list(path, load_json_file(path), where=None)
    return [validate_result(path, r, i) for i, r in enumerate(data)]


def write_results(path: str | Path, results: Iterable[dict]) -> int:
    """Write results atomically, one question per line inside the JSON list; returns the count."""
    path = Path(path)
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write("[")
        for res in results:
            res = validate_result(path, res, n)
            f.write(("\n" if n == 0 else ",\n") + json.dumps(res, ensure_ascii=False))
            n += 1
        f.write("\n]\n")
    return n


def read_trec_run(path: str | Path) -> dict[str, dict[str, float]]:
    """Read a TREC run (``qid Q0 docid rank score tag``, whitespace-separated) into ``{qid: {docid: score}}``.

    The rank column is checked to be an integer but not used: scores define the order (trec_eval does
    the same). A (qid, docid) pair listed twice is an error.
    """
    path = Path(path)
    run: dict[str, dict[str, float]] = {}
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 6:
            raise DataError(path, f"expected 6 fields 'qid Q0 docid rank score tag', got {len(parts)}", line=lineno, field="qid")
        qid, _q0, docid, rank, score, _tag = parts
        try:
            int(rank)
        except ValueError:
            raise DataError(path, f"not an integer: {rank!r}", line=lineno, field="rank") from None
        try:
            value = float(score)
        except ValueError:
            raise DataError(path, f"not a number: {score!r}", line=lineno, field="score") from None
        if not math.isfinite(value):
            raise DataError(path, f"score {value!r} is not a finite number (query {qid!r}, document {docid!r})",
                            line=lineno, field="score")
        docs = run.setdefault(qid, {})
        if docid in docs:
            raise DataError(path, f"document {docid!r} listed twice for query {qid!r}", line=lineno, field="docid")
        docs[docid] = value
    return run


def write_trec_run(path: str | Path, run: Mapping[str, Mapping[str, float]], tag: str = "dpr") -> int:
    """Write ``{qid: {docid: score}}`` as a TREC run, each query's docs by descending score (ties by
    docid, so the file is deterministic), ranks from 1; returns the number of lines."""
    path = Path(path)
    if not tag or any(c.isspace() for c in tag):
        raise DataError(path, f"run tag must be one word, got {tag!r}", field="tag")
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for qid, docs in run.items():
            for rank, (docid, score) in enumerate(sorted(docs.items(), key=lambda kv: (-kv[1], kv[0])), 1):
                if any(c.isspace() for c in qid) or any(c.isspace() for c in docid):
                    raise DataError(path, f"id with whitespace: {qid!r} / {docid!r}", line=f"row {n}", field="qid")
                f.write(f"{qid} Q0 {docid} {rank} {float(score)!r} {tag}\n")
                n += 1
    return n
