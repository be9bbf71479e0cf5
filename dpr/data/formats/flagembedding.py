"""FlagEmbedding's fine-tuning jsonl: ``{"query": str, "pos": [str], "neg": [str]}`` with optional
``pos_scores`` / ``neg_scores`` (a teacher's scores, aligned with ``pos`` / ``neg``) and ``prompt`` (the
query instruction). Passages are bare strings: they get content ids.

Negatives are imported as ``hard_negative_ctxs``; scores go to ``teacher_scores.imported.jsonl``; the
prompt is kept on the example (``prompt``) and written back on export; training does not apply it
(give it as ``model.question_prefix``). Other keys (``type``) are ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

from dpr.atomic import atomic_path
from dpr.data._io import get_str, get_str_list, iter_jsonl
from dpr.data.formats.common import Collector, check_scores, passage_string
from dpr.errors import DataError

EXTENSIONS = (".jsonl",)
HAS_SCORES = True


def read(path: str | Path, col: Collector, split: str = "train", corpus: Mapping | None = None) -> None:
    """Add every record of a FlagEmbedding jsonl file to ``col``."""
    path = Path(path)
    for lineno, obj in iter_jsonl(path):
        query = get_str(path, obj, "query", lineno)
        pos_texts = get_str_list(path, obj, "pos", lineno, nonempty=True)
        neg_texts = get_str_list(path, obj, "neg", lineno) if "neg" in obj else []
        prompt = get_str(path, obj, "prompt", lineno, nonempty=False) if obj.get("prompt") is not None else None
        pos = [col.passage(path, lineno, f"pos[{j}]", None, "", t) for j, t in enumerate(pos_texts)]
        neg = [col.passage(path, lineno, f"neg[{j}]", None, "", t) for j, t in enumerate(neg_texts)]
        scores: dict[str, float] = {}
        for key, ids in (("pos_scores", pos), ("neg_scores", neg)):
            if obj.get(key) is not None:
                for pid, s in zip(ids, check_scores(path, obj[key], len(ids), lineno, key)):
                    if scores.get(pid, s) != s:  # one text twice in the record, with two scores
                        raise DataError(path, f"passage listed twice with two scores ({pid})", line=lineno, field=key)
                    scores[pid] = s
        col.add(path, lineno, query, pos, neg, split=split, scores=scores, prompt=prompt)


def write(path: str | Path, examples: Iterable[Mapping], scores: Mapping[str, Mapping[str, float]]) -> dict:
    """Write examples as FlagEmbedding jsonl; ``pos_scores``/``neg_scores`` where every passage of the
    record has a teacher score (``scores``: query id → {passage id: score}). Returns counts."""
    n = scored = 0
    with atomic_path(Path(path)) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for ex in examples:
            pos, neg = ex["positive_ctxs"], ex["hard_negative_ctxs"]
            rec: dict = {"query": ex["question"], "pos": [passage_string(c) for c in pos],
                         "neg": [passage_string(c) for c in neg]}
            qs = scores.get(ex.get("query_id") or "", {})
            if qs and all(c["passage_id"] in qs for c in [*pos, *neg]):
                rec["pos_scores"] = [qs[c["passage_id"]] for c in pos]
                rec["neg_scores"] = [qs[c["passage_id"]] for c in neg]
                scored += 1
            if ex.get("prompt") is not None:
                rec["prompt"] = ex["prompt"]
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return {"records": n, "records_with_scores": scored}
