"""The false-negative filter: which retrieved candidates may become a question's hard negatives.

One rule for every miner (BM25, `dpr.negatives.bm25`; dense re-mining, `dpr.negatives.dense`; any
`Retriever`, `dpr.negatives.mine`) and for the readers of mined lists (the cross-encoder's groups,
`dpr.rerank.data`; the false-negative figures of `dpr.inspect`). A candidate is rejected, first reason
first, when it is

- one of the question's positives (``rejected_positive``), or a document judged for it in qrels
  (``rejected_judged``);
- a passage containing one of its answers by DPR's has_answer rule (string mode): a likely false
  negative (``rejected_answer``);
- ranked above ``skip_top`` (FlagEmbedding mines ranks 2-200: the very top is often an unlabelled
  positive; ``rejected_top``);
- scored above ``pos - relative_margin * |pos|``, ``pos`` the positive's score (sentence-transformers'
  ``mine_hard_negatives(relative_margin=...)``: a candidate nearly as similar as the positive is more
  likely a false negative than a hard one; ``rejected_margin``).

The last two are off by default (``skip_top=0``, ``relative_margin=0``): the BM25 miner uses neither.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Collection, Iterable, Mapping, Sequence

from dpr.eval.has_answer import has_answer

# the rejection counts, in the order the filters are tried
FILTERS = ("rejected_positive", "rejected_judged", "rejected_answer", "rejected_top", "rejected_margin")


def answer_check(answers: Sequence[str], passage: Callable[[str], Mapping[str, str | None]], *,
                 check_title: bool) -> Callable[[str], bool] | None:
    """``pid -> bool``: does passage ``pid`` (``passage(pid)``: a mapping with ``text`` and ``title``) hold
    one of ``answers``; None when there are no answers (qrels data: nothing to check).

    ``check_title`` is each caller's own rule, kept explicit: the miners (BM25, dense) also reject a
    passage whose *title* names the answer (a passage about the answer is likely relevant even when its
    text does not repeat it), while the cross-encoder's groups and the inspect figures check the text
    only, the rule of the trainer's masks (`dpr.training.masks.pair_masks`), so that what they drop or
    count is what the masks would ignore.
    """
    if not answers:
        return None

    def contains(pid: str) -> bool:
        p = passage(pid)
        return has_answer(answers, p["text"]) or (check_title and has_answer(answers, p["title"] or ""))

    return contains


def rejection(pid: str, rank: int = 0, score: float = 0.0, *, positives: Collection[str],
              judged: Collection[str] = (), contains_answer: Callable[[str], bool] | None = None,
              skip_top: int = 0, threshold: float | None = None) -> str | None:
    """The first filter (one of `FILTERS`) that rejects candidate ``pid`` at ``rank`` (0-based) with
    ``score``, or None when it may be a negative. ``threshold``: the margin filter's (None: off)."""
    if pid in positives:
        return "rejected_positive"
    if pid in judged:
        return "rejected_judged"
    if contains_answer is not None and contains_answer(pid):
        return "rejected_answer"
    if rank < skip_top:
        return "rejected_top"
    if threshold is not None and score > threshold:
        return "rejected_margin"
    return None


def select_negatives(
    candidates: Iterable[tuple[str, float]],
    positive_score: float | None = None,
    *,
    positives: Collection[str],
    judged: Collection[str] = (),
    contains_answer: Callable[[str], bool] | None = None,
    num_negatives: int | None = 30,
    skip_top: int = 0,
    relative_margin: float = 0.0,
) -> tuple[list[str], Counter]:
    """The ids of up to ``num_negatives`` (None: all) ranked ``(id, score)`` candidates, best first, that
    pass every filter, and the counts (``examined``, ``kept`` and each of `FILTERS`). Candidates past the
    last one needed are not examined. ``positive_score`` is needed only by the margin filter."""
    threshold = None
    if relative_margin > 0:
        if positive_score is None:
            raise ValueError("the margin filter (relative_margin > 0) needs the positive's score")
        threshold = positive_score - relative_margin * abs(positive_score)
    counts: Counter = Counter()
    kept: list[str] = []
    for rank, (pid, score) in enumerate(candidates):
        if num_negatives is not None and len(kept) >= num_negatives:
            break
        counts["examined"] += 1
        reason = rejection(pid, rank, score, positives=positives, judged=judged, contains_answer=contains_answer,
                           skip_top=skip_top, threshold=threshold)
        if reason is None:
            kept.append(pid)
        else:
            counts[reason] += 1
    counts["kept"] += len(kept)
    return kept, counts


def false_negative(ctx: Mapping[str, str | None], *, relevant: Collection[str], answers: Sequence[str],
                   check_title: bool) -> str | None:
    """Why the ctx dict ``ctx`` (``passage_id``, ``title``, ``text``) of an already-mined list is no
    negative (``rejected_positive``: in ``relevant``; ``rejected_answer``), or None: the filter's first
    three rules applied to one passage (see `answer_check` for ``check_title``)."""
    return rejection(ctx["passage_id"], positives=relevant,
                     contains_answer=answer_check(answers, lambda _pid: ctx, check_title=check_title))
