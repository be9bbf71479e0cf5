"""Open-domain reading: answer each question of a DPR results file from its top k passages.

The top ``max(ks)`` passages of every question are read once (each (question, passage) pair at most
once, across calls too, through ``cache``); for each k the answer is chosen among the first k
readings under one :class:`~dpr.reader.infer.AnswerRule` (:func:`dpr.reader.infer.choose`). Beside EM/F1 it counts the questions answered exactly
although no top-k passage holds an answer by DPR's ``has_answer``: top-k accuracy bounds EM, and
these are the (few) places where the two matchers disagree.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from dpr.eval.topk import first_hit_ranks
from dpr.reader.infer import AnswerRule, Reading, choose, read_pairs
from dpr.reader.squad_metrics import evaluate, score

DEFAULT_KS = (1, 5, 20)


def read_records(model, tokenizer, settings: dict, records: Sequence[dict], depth: int,
                 cache: dict | None = None, **read_kw: Any) -> list[list[list[Reading]]]:
    """The window readings of each record's first ``depth`` ctxs (``{title, text}``), in rank order."""
    cache = {} if cache is None else cache

    def key(rec: dict, ctx: dict) -> tuple:
        return rec["question"], ctx.get("title", ""), ctx["text"]

    todo = list(dict.fromkeys(key(r, c) for r in records for c in r["ctxs"][:depth] if key(r, c) not in cache))
    for k, reading in zip(todo, read_pairs(model, tokenizer, settings, todo, **read_kw)):
        cache[k] = reading
    return [[cache[key(r, c)] for c in r["ctxs"][:depth]] for r in records]


def answer_at_k(readings: Sequence[Sequence[Sequence[Reading]]], k: int,
                rule: AnswerRule) -> list[str]:
    """Each question's answer from its first k passages' readings ("" when none has a window)."""
    answers = []
    for passages in readings:
        best = choose(passages[:k], rule)
        answers.append(best.answer if best is not None else "")
    return answers


def read_topk(model, tokenizer, settings: dict, records: Sequence[dict], rule: AnswerRule,
              ks: Iterable[int] = DEFAULT_KS, cache: dict | None = None, **read_kw: Any) -> dict:
    """``{"k": {"<k>": {"em", "f1"}}, "top_k": {"<k>": bound}, "em_above_bound": {"<k>": n},
    "predictions": {"<k>": [...]}}`` (the bound: top-k accuracy of the same questions)."""
    ks = sorted({int(k) for k in ks})
    readings = read_records(model, tokenizer, settings, records, max(ks), cache, **read_kw)
    ranks = first_hit_ranks(records, max_k=max(ks), desc="has_answer [reader bound]")
    answers = [r["answers"] for r in records]
    out: dict = {"k": {}, "top_k": {}, "em_above_bound": {}, "predictions": {}}
    for k in ks:
        preds = answer_at_k(readings, k, rule)
        out["k"][str(k)] = evaluate(preds, answers)
        out["top_k"][str(k)] = float((ranks < k).mean()) if len(ranks) else 0.0
        out["em_above_bound"][str(k)] = sum(1 for p, a, r in zip(preds, answers, ranks)
                                            if score(p, a)[0] == 1.0 and r >= k)
        out["predictions"][str(k)] = preds
    return out
