"""SQuAD v1.1's exact match and F1, with the official evaluation script's normalisation.

Normalisation (``evaluate-v1.1.py``): lower case, drop every ``string.punctuation`` character,
remove the articles a/an/the as whole words, collapse whitespace. F1 is over the bag of normalised
tokens; both scores take the maximum over the gold answers. A leaf module (standard library only).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable, Sequence

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (the official order)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, ground_truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1(prediction: str, ground_truth: str) -> float:
    pred, gold = normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
    common = Counter(pred) & Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def max_over_answers(metric, prediction: str, answers: Sequence[str]) -> float:
    """The official script's ``metric_max_over_ground_truths``."""
    if not answers:
        raise ValueError("a question needs at least one gold answer to be scored")
    return max(metric(prediction, a) for a in answers)


def score(prediction: str, answers: Sequence[str]) -> tuple[float, float]:
    """``(em, f1)`` of one prediction against its gold answers (each 0..1)."""
    return max_over_answers(exact_match, prediction, answers), max_over_answers(f1, prediction, answers)


def evaluate(predictions: Iterable[str], answers: Iterable[Sequence[str]]) -> dict[str, float]:
    """Mean EM and F1 as fractions in [0, 1] (the official script prints them x100)."""
    pairs = list(zip(predictions, answers, strict=True))
    if not pairs:
        return {"em": 0.0, "f1": 0.0}
    scores = [score(p, a) for p, a in pairs]
    return {"em": sum(s[0] for s in scores) / len(scores), "f1": sum(s[1] for s in scores) / len(scores)}
