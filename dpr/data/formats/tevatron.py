"""Tevatron's training jsonl: one line per query, ``{"query_id", "query", "positive_passages",
"negative_passages"}``, each passage ``{"docid", "title", "text"}`` (``docid`` and ``title`` optional).

Negatives are imported as ``hard_negative_ctxs`` (Tevatron's negatives are mined ones); exported from
``hard_negative_ctxs`` (DPR's random ``negative_ctxs`` are not written).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

from dpr.atomic import atomic_path
from dpr.data._io import get_id, get_list, get_str, iter_jsonl
from dpr.data.formats.common import Collector
from dpr.errors import DataError

EXTENSIONS = (".jsonl",)
HAS_SCORES = False


def _passages(path: Path, obj: dict, key: str, lineno: int, col: Collector, required: bool) -> list[str]:
    if key not in obj and not required:
        return []
    ids = []
    for j, p in enumerate(get_list(path, obj, key, lineno)):
        field = f"{key}[{j}]"
        if not isinstance(p, dict):
            raise DataError(path, f"expected a passage object, got {type(p).__name__}", line=lineno, field=field)
        docid = get_id(path, p, "docid", lineno, field=f"{field}.docid") if p.get("docid") is not None else None
        title = "" if p.get("title") is None else get_str(path, p, "title", lineno, nonempty=False, field=f"{field}.title")
        text = get_str(path, p, "text", lineno, field=f"{field}.text")
        ids.append(col.passage(path, lineno, f"{field}.text", docid, title, text))
    return ids


def read(path: str | Path, col: Collector, split: str = "train", corpus: Mapping | None = None) -> None:
    """Add every record of a Tevatron jsonl file to ``col``."""
    path = Path(path)
    for lineno, obj in iter_jsonl(path):
        qid = get_id(path, obj, "query_id", lineno) if obj.get("query_id") is not None else None
        query = get_str(path, obj, "query", lineno)
        pos = _passages(path, obj, "positive_passages", lineno, col, required=True)
        if not pos:
            raise DataError(path, "empty list (a query needs a positive passage)", line=lineno, field="positive_passages")
        neg = _passages(path, obj, "negative_passages", lineno, col, required=False)
        col.add(path, lineno, query, pos, neg, query_id=qid, split=split)


def _passage(ctx: Mapping) -> dict:
    return {"docid": ctx["passage_id"], "title": ctx["title"], "text": ctx["text"]}


def write(path: str | Path, examples: Iterable[Mapping], scores: Mapping[str, Mapping[str, float]]) -> dict:
    """Write examples as Tevatron jsonl (teacher scores have no place in it); returns counts."""
    del scores
    n = 0
    with atomic_path(Path(path)) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for ex in examples:
            rec = {"query_id": ex.get("query_id") or str(n), "query": ex["question"],
                   "positive_passages": [_passage(c) for c in ex["positive_ctxs"]],
                   "negative_passages": [_passage(c) for c in ex["hard_negative_ctxs"]]}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return {"records": n}
