"""What every peer-format reader shares: `Collector` turns records (a question, its positive and negative
passages, optional teacher scores) into the project's examples and passages.

- A passage without an id gets a stable content id, ``h`` + 16 hex digits of sha256(title, text): the
  same text imports under the same id on every machine and in every format.
- A passage seen again (same id, same text) is merged, and counted (``duplicate_passages_merged``); one
  id with two different texts is a `DataError` naming both places.
- Records of one question (the same ``query_id``, or without one the same text: MS MARCO triples and
  sentence-transformers triplets repeat the question on every row) merge into one example; a passage
  that is both a positive and a negative of one question stays a positive only (counted).
- Tabs and line breaks in texts become spaces on import, as ``passages.tsv`` stores them, so what is
  exported reads back identically.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from dpr.data.retriever_json import make_ctx
from dpr.errors import DataError

_WS_BREAK = re.compile(r"[\t\r\n]")


def normalize(text: str) -> str:
    """``text`` as ``passages.tsv`` and the TSV formats can hold it (tabs and line breaks → spaces)."""
    return _WS_BREAK.sub(" ", text)


def content_id(title: str, text: str) -> str:
    """The stable id of a passage that came without one."""
    return "h" + hashlib.sha256(f"{title}\x00{text}".encode("utf-8")).hexdigest()[:16]


def question_id(question: str) -> str:
    """The stable query id of a question that came without one."""
    return "q" + hashlib.sha256(question.encode("utf-8")).hexdigest()[:16]


def check_scores(path: str | Path, value: Any, n: int, where: int | str, field: str) -> list[float]:
    """A list of ``n`` finite numbers (teacher scores aligned with ``n`` passages)."""
    if not isinstance(value, (list, tuple)):
        raise DataError(path, f"expected a list of {n} numbers, got {type(value).__name__}", line=where, field=field)
    if len(value) != n:
        raise DataError(path, f"expected {n} scores (one per passage), got {len(value)}", line=where, field=field)
    out = []
    for i, s in enumerate(value):
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            raise DataError(path, f"item {i} is {s!r}, expected a finite number", line=where, field=field)
        out.append(float(s))
    return out


def passage_string(ctx: Mapping[str, str]) -> str:
    """A passage as one string for the formats without titles (FlagEmbedding, sentence-transformers,
    triples): ``title text`` where it has a title, as those trainers see a titled passage."""
    return f"{ctx['title']} {ctx['text']}" if ctx.get("title") else ctx["text"]


class Collector:
    """Examples and passages built up record by record (see the module docstring)."""

    def __init__(self) -> None:
        self.passages: dict[str, tuple[str, str, str]] = {}  # id -> (title, text, where first seen)
        self.questions: dict[str, dict] = {}  # query id -> {question, split, pos, neg, scores, prompt, where}
        self.counts = {"records": 0, "passage_occurrences": 0, "duplicate_passages_merged": 0,
                       "questions_merged": 0, "negatives_dropped_as_positive": 0}

    def passage(self, path: str | Path, where: int | str, field: str, pid: str | None, title: str, text: str) -> str:
        """Register one passage occurrence; returns its id."""
        title, text = normalize(title or ""), normalize(text)
        if not text.strip():
            raise DataError(path, "empty passage text", line=where, field=field)
        if pid is None:
            pid = content_id(title, text)
        elif not pid.strip() or any(c in pid for c in "\t\r\n"):
            raise DataError(path, f"invalid passage id {pid!r}", line=where, field=field)
        self.counts["passage_occurrences"] += 1
        seen = self.passages.get(pid)
        if seen is None:
            self.passages[pid] = (title, text, f"{path}:{where}")
        elif seen[:2] != (title, text):
            raise DataError(path, f"passage id {pid!r} has another title/text than at {seen[2]}", line=where, field=field)
        else:
            self.counts["duplicate_passages_merged"] += 1
        return pid

    def add(self, path: str | Path, where: int | str, question: str, positives: Sequence[str],
            negatives: Sequence[str] = (), *, query_id: str | None = None, split: str = "train",
            scores: Mapping[str, float] | None = None, prompt: str | None = None, field: str = "query") -> None:
        """One record: a question with passage ids (from `passage`) and optional ``{passage id: score}``."""
        question = normalize(question)
        if not question.strip():
            raise DataError(path, "empty question", line=where, field=field)
        if not positives:
            raise DataError(path, "no positive passage", line=where, field=field)
        qid = query_id if query_id is not None else question_id(question)
        self.counts["records"] += 1
        q = self.questions.get(qid)
        if q is None:
            q = self.questions[qid] = {"question": question, "split": split, "pos": {}, "neg": {}, "scores": {},
                                       "prompt": prompt, "where": f"{path}:{where}"}
        else:
            if q["question"] != question:
                raise DataError(path, f"query id {qid!r} has another question than at {q['where']}", line=where, field=field)
            if q["split"] != split:
                raise DataError(path, f"question {question[:60]!r} is also in the {q['split']} data ({q['where']})",
                                line=where, field=field)
            if q["prompt"] != prompt:
                raise DataError(path, f"another prompt for the question than at {q['where']}", line=where, field="prompt")
            self.counts["questions_merged"] += 1
        q["pos"].update(dict.fromkeys(positives))
        q["neg"].update(dict.fromkeys(negatives))
        for pid, s in (scores or {}).items():
            if pid in q["scores"] and q["scores"][pid] != s:
                raise DataError(path, f"passage {pid!r} scored {s} here and {q['scores'][pid]} before for this question",
                                line=where, field="scores")
            q["scores"][pid] = s

    def examples(self, split: str) -> list[dict]:
        """Retriever-JSON examples of one split (qrels data: ``query_id``, ``qrels`` = the positives at grade 1;
        the negatives are ``hard_negative_ctxs``)."""
        out = []
        for qid, q in self.questions.items():
            if q["split"] != split:
                continue
            pos = list(q["pos"])
            neg = [p for p in q["neg"] if p not in q["pos"]]
            ex = {
                "question": q["question"],
                "answers": [],
                "positive_ctxs": [self.ctx(p) for p in pos],
                "negative_ctxs": [],
                "hard_negative_ctxs": [self.ctx(p) for p in neg],
                "query_id": qid,
                "qrels": {p: 1 for p in pos},
            }
            if q["prompt"] is not None:
                ex["prompt"] = q["prompt"]
            out.append(ex)
        return out

    def dropped_negatives(self) -> int:
        return sum(sum(1 for p in q["neg"] if p in q["pos"]) for q in self.questions.values())

    def ctx(self, pid: str) -> dict:
        title, text, _ = self.passages[pid]
        return make_ctx(pid, title, text)

    def teacher_scores(self) -> list[dict]:
        """One line per scored question: ``{question, query_id, split, passage_ids, scores}``, positives first."""
        out = []
        for qid, q in self.questions.items():
            if not q["scores"]:
                continue
            order = [p for p in [*q["pos"], *q["neg"]] if p in q["scores"]]
            out.append({"question": q["question"], "query_id": qid, "split": q["split"],
                        "passage_ids": order, "scores": [q["scores"][p] for p in order]})
        return out

    def passage_rows(self) -> Iterable[tuple[str, str, str]]:
        return ((pid, text, title) for pid, (title, text, _) in self.passages.items())
