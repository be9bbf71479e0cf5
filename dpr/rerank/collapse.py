"""Refusing a trained cross-encoder whose scores cannot tell pairs apart: the cross-encoder's counterpart of
`dpr.models.pooling.check_not_collapsed`. A head that learned a constant, or training that diverged to one
point (or to NaN), gives every (question, passage) pair the same score; a reranker that ranks nothing must not
be saved as a finished run.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from dpr.rerank.model import document_text
from dpr.rerank.score import score_pairs

COLLAPSE_SAMPLE = 64  # training pairs scored by `check_scores_vary`


def sample_pairs(examples: Sequence[dict], tokenizer: Any, use_title: bool) -> tuple[list[str], list[str]]:
    """``(questions, documents)``: up to :data:`COLLAPSE_SAMPLE` different pairs, each training example's question
    with its first positive and its first mined negative, in the file's order (the same pairs every run)."""
    seen: set[tuple[str, str]] = set()
    questions: list[str] = []
    documents: list[str] = []
    for ex in examples:
        ctxs = (ex.get("positive_ctxs") or [])[:1] + (ex.get("hard_negative_ctxs") or [])[:1]
        for ctx in ctxs:
            if not ctx.get("text", "").strip():
                continue
            doc = document_text(ctx.get("title") or "", ctx["text"], tokenizer, use_title)
            if (ex["question"], doc) not in seen:
                seen.add((ex["question"], doc))
                questions.append(ex["question"])
                documents.append(doc)
        if len(questions) >= COLLAPSE_SAMPLE:
            break
    return questions[:COLLAPSE_SAMPLE], documents[:COLLAPSE_SAMPLE]


def distinct_scores(scores: torch.Tensor) -> int:
    """How many of ``scores`` differ (by more than a millionth of their scale) from every other; a non-finite
    score counts as none."""
    finite = torch.sort(scores[torch.isfinite(scores)].double()).values
    if not len(finite):
        return 0
    tol = 1e-6 * max(1.0, float(finite.abs().max()))
    return 1 + int((finite.diff() > tol).sum())


def check_scores_vary(model: torch.nn.Module, tokenizer: Any, examples: Sequence[dict], *, max_length: int,
                      use_title: bool, where: str) -> None:
    """Refuse (ValueError, one line) to call a trained cross-encoder done when its scores cannot tell pairs apart:
    the pairs of :func:`sample_pairs`, scored in fp32 without dropout; fewer distinct scores than a quarter of the
    pairs is a collapse (the rule of the bi-encoder's vectors)."""
    questions, documents = sample_pairs(examples, tokenizer, use_title)
    if len(questions) < 4:
        return
    scores = score_pairs(model, tokenizer, questions, documents, autocast="off", max_length=max_length)
    distinct = distinct_scores(scores)
    if distinct < len(questions) // 4:
        raise ValueError(f"{where}: the trained cross-encoder gives {distinct} distinct scores for {len(questions)} "
                         "different training (question, passage) pairs: its scores cannot tell passages apart "
                         "(check rerank.train.lr and the precision); the run is not marked finished")
