"""SQuAD v1.1 EM/F1 against an independent copy of the official evaluate-v1.1.py logic, and the
best-span search's guarantees."""

from __future__ import annotations

import random
import re
import string
from collections import Counter

import numpy as np
import pytest

from dpr.reader.spans import best_spans
from dpr.reader.squad_metrics import evaluate, normalize_answer, score


# --- reference: the published logic of SQuAD v1.1's evaluate-v1.1.py, written out independently ---
def _ref_normalize(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def _ref_f1(prediction, ground_truth):
    prediction_tokens = _ref_normalize(prediction).split()
    ground_truth_tokens = _ref_normalize(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def _ref_em(prediction, ground_truth):
    return _ref_normalize(prediction) == _ref_normalize(ground_truth)


def _ref_max(metric_fn, prediction, ground_truths):
    return max(metric_fn(prediction, gt) for gt in ground_truths)


def _ref_evaluate(preds, golds):
    em = f1 = 0.0
    for p, g in zip(preds, golds):
        em += _ref_max(_ref_em, p, g)
        f1 += _ref_max(_ref_f1, p, g)
    return {"exact_match": 100.0 * em / len(preds), "f1": 100.0 * f1 / len(preds)}


SAMPLE = [
    ("the Eiffel Tower", ["Eiffel Tower"]),
    ("An apple a day", ["apple day"]),
    ("Denver Broncos!", ["Denver Broncos", "The Broncos"]),
    ("broncos", ["Denver Broncos", "The Broncos"]),
    ("in the 1990s", ["1990s", "the 1990s."]),
    ("U.S.A.", ["USA"]),
    ("Théâtre de l'Odéon", ["théâtre de lodéon"]),
    ("theory of the atom", ["atomic theory"]),
    ("", ["something"]),
    ("a", ["an"]),
    ("Santa Clara, California", ["Santa Clara", "Levi's Stadium", "Santa Clara, California"]),
    ("1,000 men and women", ["1000 men"]),
    ("  multiple   spaces\there ", ["multiple spaces here"]),
    ("anthem the band", ["the anthem band"]),
]


def test_em_f1_match_the_official_script_on_a_sample():
    preds = [p for p, _ in SAMPLE]
    golds = [g for _, g in SAMPLE]
    for p, g in SAMPLE:
        em, f1 = score(p, g)
        assert em == float(_ref_max(_ref_em, p, g))
        assert f1 == pytest.approx(_ref_max(_ref_f1, p, g))
    ours, ref = evaluate(preds, golds), _ref_evaluate(preds, golds)
    assert 100 * ours["em"] == pytest.approx(ref["exact_match"])
    assert 100 * ours["f1"] == pytest.approx(ref["f1"])
    assert 0 < ours["em"] < ours["f1"] < 1  # the sample has hits, misses and partial overlaps


def test_em_f1_match_on_random_strings():
    rng = random.Random(0)
    words = ["the", "a", "an", "Cat", "cat.", "dog,", "Dog", "é", "(x)", "1,000", "—", "theater"]
    for _ in range(300):
        pred = " ".join(rng.choice(words) for _ in range(rng.randint(0, 5)))
        golds = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 3))]
        em, f1 = score(pred, golds)
        assert em == float(_ref_max(_ref_em, pred, golds))
        assert f1 == pytest.approx(_ref_max(_ref_f1, pred, golds))
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"


def test_best_span_is_ordered_and_within_max_length():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(5, 60))
        start, end = rng.normal(size=n), rng.normal(size=n)
        first = int(rng.integers(0, n - 1))
        last = int(rng.integers(first, n))
        max_len = int(rng.integers(1, 8))
        spans = best_spans(start, end, first, last, max_answer_length=max_len, n_best=int(rng.integers(1, 6)), top=5)
        assert spans
        for s in spans:
            assert first <= s.start <= s.end <= last
            assert s.end - s.start + 1 <= max_len
        assert [s.score for s in spans] == sorted((s.score for s in spans), reverse=True)
    # n-best starts all after n-best ends: still a valid span (the fallback search)
    start = np.array([0, 0, 0, 0, 9.0]); end = np.array([9.0, 0, 0, 0, 0])
    (s,) = best_spans(start, end, 0, 4, max_answer_length=3, n_best=1)
    assert s.start <= s.end and s.end - s.start < 3


def test_best_span_finds_the_exact_best_pair():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n = 30
        start, end = rng.normal(size=n), rng.normal(size=n)
        (got,) = best_spans(start, end, 2, 25, max_answer_length=5, n_best=n)
        brute = max(((start[a] + end[b], a, b) for a in range(2, 26) for b in range(a, min(a + 5, 26))))
        assert (got.start, got.end) == (brute[1], brute[2])
