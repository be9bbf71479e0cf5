"""The figures of `dpr-data inspect`, each a pure function of the examples (hand-countable in tests)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, Callable, Sequence

import numpy as np

from dpr.data.retriever_json import relevant_ids
from dpr.negatives.filters import false_negative


def counts(train: Sequence[dict], dev: Sequence[dict], n_passages: int) -> dict:
    """Sizes, and the questions the trainer cannot use well (no positive; no negative of either kind)."""
    n = len(train)
    no_pos = sum(1 for ex in train if not ex["positive_ctxs"])
    no_neg = sum(1 for ex in train if not ex["hard_negative_ctxs"] and not ex["negative_ctxs"])
    return {
        "passages": n_passages,
        "questions": {"train": n, "dev": len(dev)},
        "positives_per_question": _mean([len(ex["positive_ctxs"]) for ex in train]),
        "hard_negatives_per_question": _mean([len(ex["hard_negative_ctxs"]) for ex in train]),
        "questions_without_positives": no_pos,
        "questions_without_negatives": no_neg,
        "share_without_positives": no_pos / n if n else 0.0,
        "share_without_negatives": no_neg / n if n else 0.0,
    }


def shared_positives(train: Sequence[dict], batch_size: int) -> dict:
    """Questions whose training positive (the first of ``positive_ctxs``) is another question's too, and
    how many such same-positive pairs a uniformly drawn batch of ``batch_size`` questions holds on average
    (each is an in-batch false negative unless ``train.dedup_positives`` keeps them apart)."""
    firsts = [ex["positive_ctxs"][0]["passage_id"] for ex in train if ex["positive_ctxs"]]
    c = Counter(firsts)
    n, b = len(firsts), min(int(batch_size), len(firsts))
    pairs = sum(k * (k - 1) // 2 for k in c.values())
    expected = pairs * b * (b - 1) / (n * (n - 1)) if n > 1 else 0.0
    return {
        "questions_sharing_a_positive": sum(k for k in c.values() if k > 1),
        "positives_shared": sum(1 for k in c.values() if k > 1),
        "same_positive_pairs": pairs,
        "batch_size": int(batch_size),
        "expected_colliding_pairs_per_batch": expected,
    }


def false_negatives(train: Sequence[dict], kind: str) -> dict:
    """Mined negatives (``hard_negative_ctxs``) that are no negatives: judged relevant for their question
    (``positive_ctxs`` / ``qrels``) or, on QA data, containing one of its answers (DPR's has_answer)."""
    total = judged = answer = 0
    for ex in train:
        rel = relevant_ids(ex)
        answers = ex["answers"] if kind == "qa" else ()
        for c in ex["hard_negative_ctxs"]:
            total += 1
            # the miners' filter, text only (check_title=False): the rule the trainer's masks apply
            why = false_negative(c, relevant=rel, answers=answers, check_title=False)
            judged += why == "rejected_positive"
            answer += why == "rejected_answer"
    return {"mined_negatives": total, "judged_relevant": judged, "contain_answer": answer,
            "false_negative_rate": (judged + answer) / total if total else 0.0}


def token_lengths(tokenize: Callable[[list[str], list[str] | None], list[int]], texts: Sequence[str],
                  titles: Sequence[str] | None, max_length: int) -> dict:
    """Token counts (special tokens included, untruncated) against ``max_length``."""
    lengths = tokenize(list(texts), list(titles) if titles is not None else None)
    arr = np.asarray(lengths, dtype=np.int64)
    over = int((arr > max_length).sum()) if len(arr) else 0
    return {"count": len(arr), "max_length": int(max_length), "truncated": over,
            "share_truncated": over / len(arr) if len(arr) else 0.0,
            "mean": float(arr.mean()) if len(arr) else 0.0,
            "p50": float(np.percentile(arr, 50)) if len(arr) else 0.0,
            "p95": float(np.percentile(arr, 95)) if len(arr) else 0.0,
            "max": int(arr.max()) if len(arr) else 0, "lengths": lengths}


def teacher(train: Sequence[dict], scores: dict[str, dict[str, float]], bins: int) -> dict | None:
    """The teacher's scale and its positive-minus-negative margins over every scored (positive,
    negative) pair of a training question; None when no training question has scores."""
    all_scores, pos_s, neg_s, margins = [], [], [], []
    for ex in train:
        qs = scores.get(ex.get("query_id") or "")
        if not qs:
            continue
        rel = relevant_ids(ex)
        p = [qs[c] for c in rel if c in qs]
        n = [qs[c["passage_id"]] for c in ex["hard_negative_ctxs"] if c["passage_id"] in qs]
        all_scores += list(qs.values())
        pos_s += p
        neg_s += n
        margins += [a - b for a in p for b in n]
    if not all_scores:
        return None
    m = np.asarray(margins, dtype=np.float64)
    hist, edges = (np.histogram(m, bins=bins) if len(m) else (np.zeros(0), np.zeros(0)))
    return {
        "scores": len(all_scores), "min": min(all_scores), "max": max(all_scores),
        "positive_mean": _mean(pos_s), "negative_mean": _mean(neg_s),
        "pairs": len(m), "margin_mean": float(m.mean()) if len(m) else 0.0,
        "share_positive_above": float((m > 0).mean()) if len(m) else 0.0,
        "margin_histogram": {"counts": hist.astype(int).tolist(), "edges": edges.tolist()},
        "margins": margins,
    }


def sample(items: Sequence[Any], limit: int, seed: int) -> list[Any]:
    """``items`` itself up to ``limit``, else a seeded sample in file order."""
    if limit <= 0 or len(items) <= limit:
        return list(items)
    keep = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in keep]


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


__all__ = ["counts", "shared_positives", "false_negatives", "token_lengths", "teacher", "sample"]
