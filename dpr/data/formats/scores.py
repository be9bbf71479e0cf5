"""``teacher_scores.imported.jsonl``: the teacher scores that came with an imported training set
(FlagEmbedding ``pos_scores``/``neg_scores``, sentence-transformers ``scores``), kept as they were.

One line per scored question: ``{"question", "query_id", "split", "passage_ids": [...], "scores": [...]}``
(the question's positives first, then its negatives, each passage once; scores on the teacher's own
scale). The exporters write it back into the formats that hold scores; distillation (`loss=kl_distill` or
`margin_mse`, `train.teacher_denoise`) turns it into the fingerprinted `teacher_scores.jsonl`
(`dpr.training.imported_scores`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

from dpr.atomic import atomic_path
from dpr.data._io import get_id, get_list, get_str, iter_jsonl
from dpr.data.formats.common import check_scores

FILE_NAME = "teacher_scores.imported.jsonl"


def write_teacher_scores(path: str | Path, lines: Iterable[Mapping]) -> int:
    n = 0
    with atomic_path(Path(path)) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(json.dumps(dict(line), ensure_ascii=False) + "\n")
            n += 1
    return n


def read_teacher_scores(path: str | Path) -> dict[str, dict[str, float]]:
    """``{query id: {passage id: score}}`` of a teacher-scores file (validated; {} when absent)."""
    path = Path(path)
    if not path.is_file():
        return {}
    out: dict[str, dict[str, float]] = {}
    for lineno, obj in iter_jsonl(path):
        get_str(path, obj, "question", lineno)
        qid = get_id(path, obj, "query_id", lineno)
        ids = [get_id(path, {"id": p}, "id", lineno, field=f"passage_ids[{j}]")
               for j, p in enumerate(get_list(path, obj, "passage_ids", lineno))]
        scores = check_scores(path, obj.get("scores"), len(ids), lineno, "scores")
        out[qid] = dict(zip(ids, scores))
    return out
