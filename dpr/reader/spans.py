"""Best answer spans from start/end logits: the n-best starts × n-best ends, valid pairs only.

A pair is valid when both tokens lie in the passage range, ``start <= end`` and the span is at most
``max_answer_length`` tokens; its score is ``start_logit + end_logit`` (the usual SQuAD/DPR reader
scoring). When no n-best pair is valid (all top starts after all top ends), every valid pair is
searched, so a passage always yields a span.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Span(NamedTuple):
    start: int   # token index (inclusive)
    end: int     # token index (inclusive)
    score: float


def _valid_pairs(starts: np.ndarray, ends: np.ndarray, max_answer_length: int) -> tuple[np.ndarray, np.ndarray]:
    s, e = np.meshgrid(starts, ends, indexing="ij")
    ok = (e >= s) & (e - s + 1 <= max_answer_length)
    return s[ok], e[ok]


def best_spans(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    first: int,
    last: int,
    max_answer_length: int = 30,
    n_best: int = 20,
    top: int = 1,
) -> list[Span]:
    """The ``top`` best valid spans inside tokens ``first..last`` (inclusive), best first."""
    if max_answer_length < 1:
        raise ValueError(f"max_answer_length must be >= 1, got {max_answer_length}")
    if not 0 <= first <= last < len(start_logits) or len(end_logits) != len(start_logits):
        raise ValueError(f"bad passage range {first}..{last} for {len(start_logits)} logits")
    start_logits = np.asarray(start_logits, dtype=np.float64)
    end_logits = np.asarray(end_logits, dtype=np.float64)
    idx = np.arange(first, last + 1)
    # stable order on ties: the earlier token first
    order_s = idx[np.argsort(-start_logits[idx], kind="stable")][:n_best]
    order_e = idx[np.argsort(-end_logits[idx], kind="stable")][:n_best]
    s, e = _valid_pairs(order_s, order_e, max_answer_length)
    if len(s) == 0:
        s, e = _valid_pairs(idx, idx, max_answer_length)
    scores = start_logits[s] + end_logits[e]
    order = np.lexsort((e, s, -scores))[:top]
    return [Span(int(s[i]), int(e[i]), float(scores[i])) for i in order]
