"""Top-k retrieval accuracy for QA data: the fraction of questions with an answer in their top k passages.

Everything is derived from one number per question, the rank of its first passage that contains an answer
(``has_answer`` recomputed here; the ``has_answer`` flag stored in a results file is not trusted).
"""

from __future__ import annotations

import logging
from typing import Iterable, Sequence

import numpy as np
from tqdm import tqdm

from dpr.eval.config import EvalConfig
from dpr.eval.has_answer import has_answer

log = logging.getLogger(__name__)

DEFAULT_KS = tuple(EvalConfig().ks)  # EvalConfig's (dpr/eval/config.py)

# A question with no answer-bearing passage in its list gets this rank: larger than any k.
NO_HIT = np.iinfo(np.int64).max


def first_hit_ranks(
    results: Sequence[dict],
    match: str = "string",
    max_k: int | None = None,
    desc: str = "has_answer",
) -> np.ndarray:
    """0-based rank of each question's first context containing an answer (``NO_HIT`` when none does).

    ``results`` are DPR results records (``answers``, ``ctxs: [{text, ...}]``); only the first ``max_k``
    contexts are checked. Contexts are assumed sorted best first, as retrievers write them.
    """
    ranks = np.full(len(results), NO_HIT, dtype=np.int64)
    for qi, record in enumerate(tqdm(results, desc=desc, unit="q", mininterval=1.0)):
        answers = record["answers"]
        ctxs = record["ctxs"] if max_k is None else record["ctxs"][:max_k]
        for rank, ctx in enumerate(ctxs):
            if has_answer(answers, ctx["text"], mode=match):
                ranks[qi] = rank
                break
    return ranks


def hits_at(ranks: np.ndarray, ks: Iterable[int]) -> np.ndarray:
    """Boolean matrix ``[num_questions, len(ks)]``: is the first hit within the top k?"""
    ks_arr = np.asarray(list(ks), dtype=np.int64)
    return ranks[:, None] < ks_arr[None, :]


def top_k_accuracy(ranks: np.ndarray, ks: Iterable[int] = DEFAULT_KS) -> dict[int, float]:
    """``{k: fraction of questions whose first hit is within the top k}``."""
    ks = list(ks)
    if len(ranks) == 0:
        return {k: 0.0 for k in ks}
    hits = hits_at(ranks, ks)
    return {k: float(hits[:, j].mean()) for j, k in enumerate(ks)}


def min_num_ctxs(results: Sequence[dict]) -> int:
    """Fewest contexts any question has: top-k above this is computed from a shortened list."""
    return min((len(r["ctxs"]) for r in results), default=0)
