"""DPR retriever training data: a JSON list of
``{question, answers, positive_ctxs, negative_ctxs, hard_negative_ctxs}``, each ctx
``{passage_id, title, text}`` (extra keys such as ``score``/``has_answer`` are kept as they are).

Qrels data adds two optional keys per example: ``query_id`` and ``qrels`` (``{passage id: grade}``, every
passage judged relevant for the query, uncapped: ``positive_ctxs`` may carry only the first few with their
texts). The false-negative masks and dev nDCG@10 read ``qrels``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from dpr.atomic import atomic_path
from dpr.data._io import expect_list, get_id, get_list, get_str, get_str_list, load_json_file, record
from dpr.errors import DataError

CTX_LISTS = ("positive_ctxs", "negative_ctxs", "hard_negative_ctxs")


def _check_ctx(path: Path, ctx: object, where: str, field: str) -> dict:
    if not isinstance(ctx, dict):
        raise DataError(path, f"expected a ctx object, got {type(ctx).__name__}", line=where, field=field)
    out = dict(ctx)
    out["passage_id"] = get_id(path, ctx, "passage_id", where, field=f"{field}.passage_id")
    out["title"] = get_str(path, ctx, "title", where, nonempty=False, field=f"{field}.title")
    out["text"] = get_str(path, ctx, "text", where, field=f"{field}.text")
    return out


def validate_example(path: str | Path, ex: object, i: int) -> dict:
    """Check one example; returns it with ctx ids as strings and absent negative lists as ``[]``.

    ``answers`` may be empty (qrels data has no answer strings) and so may ``positive_ctxs`` (DPR's
    own dev files have such examples; the trainer skips them). ``negative_ctxs`` and
    ``hard_negative_ctxs`` may be absent: community files often leave them out.
    """
    path = Path(path)
    where = record(i)
    if not isinstance(ex, dict):
        raise DataError(path, f"expected an object, got {type(ex).__name__}", line=where)
    out = dict(ex)
    out["question"] = get_str(path, ex, "question", where)
    out["answers"] = get_str_list(path, ex, "answers", where)
    for key in CTX_LISTS:
        if key not in ex and key != "positive_ctxs":
            out[key] = []
            continue
        ctxs = get_list(path, ex, key, where)
        out[key] = [_check_ctx(path, c, where, f"{key}[{j}]") for j, c in enumerate(ctxs)]
    if "qrels" in ex:
        out["qrels"] = _check_qrels(path, ex["qrels"], where)
    return out


def _check_qrels(path: Path, qrels: object, where: str) -> dict[str, int]:
    if not isinstance(qrels, dict):
        raise DataError(path, f"expected an object {{passage id: grade}}, got {type(qrels).__name__}",
                        line=where, field="qrels")
    out: dict[str, int] = {}
    for pid, grade in qrels.items():
        if isinstance(grade, bool) or not isinstance(grade, int):
            raise DataError(path, f"grade {grade!r} is not an integer", line=where, field=f"qrels.{pid}")
        out[str(pid)] = grade
    return out


def read_retriever_json(path: str | Path) -> list[dict]:
    """Read and validate a DPR retriever JSON file (errors name the record index, 0-based, and field)."""
    path = Path(path)
    data = expect_list(path, load_json_file(path), where=None)
    return [validate_example(path, ex, i) for i, ex in enumerate(data)]


def write_retriever_json(path: str | Path, examples: Iterable[dict]) -> int:
    """Write examples atomically, one example per line inside the JSON list (streams, greppable).

    Each example is validated first, so a file we write always reads back; returns the count.
    """
    path = Path(path)
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write("[")
        for ex in examples:
            ex = validate_example(path, ex, n)
            f.write(("\n" if n == 0 else ",\n") + json.dumps(ex, ensure_ascii=False))
            n += 1
        f.write("\n]\n")
    return n


def relevant_ids(example: dict) -> frozenset[str]:
    """Every passage relevant for the example's question: its ``positive_ctxs`` and, on qrels data, every
    passage its ``qrels`` grade 1 or more (those past the ``max_positives`` cap included)."""
    ids = {str(c["passage_id"]) for c in example["positive_ctxs"]}
    return frozenset(ids | {str(pid) for pid, rel in (example.get("qrels") or {}).items() if rel >= 1})


def make_ctx(passage_id: str, title: str, text: str, **extra) -> dict:
    """A ctx dict in the canonical key order."""
    return {"passage_id": str(passage_id), "title": title, "text": text, **extra}
