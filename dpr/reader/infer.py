"""Reading passages: the best span of each window of each (question, passage) pair, and the answer
across passages.

Every pair is cut into windows (as in training, with the settings the reader was trained with);
windows of all pairs are batched together by length. A passage's reading is the list of its windows'
best spans (:class:`Reading`), each with its window's relevance logit: a window's span is never paired
with another window's relevance.

Across passages the answer is the window span with the highest
``span score + passage_weight * relevance - rank_weight * log(1 + retriever rank)`` (:class:`AnswerRule`). The span score is ``logit``
(start + end logit) or ``log_prob`` (the span's log-probability under the window's own start and end
softmaxes, what the span loss trains); the default is ``reader_cfg.eval.span_score`` (docs/results/reader.md:
on dev, log_prob was far worse open-domain for a reader trained without negatives). Within a window both scores rank spans identically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from dpr.reader.model import Reader
from dpr.reader.spans import best_spans
from dpr.reader.windows import make_windows
from dpr.trainkit.precision import autocast_context

SPAN_SCORES = ("log_prob", "logit")


@dataclass
class Reading:
    """One window's best span."""

    answer: str
    span_score: float     # start logit + end logit of the span
    relevance: float      # the window's relevance logit ([CLS])
    log_norm: float = 0.0  # logsumexp of the window's passage start logits + that of its end logits

    @property
    def log_prob(self) -> float:
        """log P(start) + log P(end) under the window's softmaxes over its passage tokens."""
        return self.span_score - self.log_norm


@dataclass(frozen=True)
class AnswerRule:
    """How window spans of different passages compare:
    ``span + passage_weight * relevance - rank_weight * log(1 + retriever rank)``.

    A very large ``passage_weight`` reads DPR's rule (the passage with the best relevance first, then
    its best span); 0 ignores the relevance head. ``rank_weight`` is a prior from the retriever's own
    order (rank 0 = its first passage): the reader alone picks confident wrong spans in low-ranked
    passages, so without it EM *falls* as k grows (docs/results/reader.md, dev). Defaults are
    ``reader_cfg.eval``'s (ReaderEvalConfig); ``rank_weight`` 0 (no prior) is what reading gold passages uses,
    which have no retriever order.
    """

    span_score: str       # log_prob | logit
    passage_weight: float
    rank_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.span_score not in SPAN_SCORES:
            raise ValueError(f"span_score must be one of {SPAN_SCORES}, got {self.span_score!r}")
        if self.rank_weight < 0:
            raise ValueError(f"rank_weight must be >= 0, got {self.rank_weight}")

    def score(self, r: Reading, rank: int = 0) -> float:
        span = r.log_prob if self.span_score == "log_prob" else r.span_score
        return span + self.passage_weight * r.relevance - self.rank_weight * math.log1p(rank)


def choose(passages: Sequence[Sequence[Reading]], rule: AnswerRule) -> Reading | None:
    """The best-scoring window span of all windows of ``passages`` (in retriever order: the index is the
    rank; earlier passage and window on ties; None when no passage has a window)."""
    best, best_score = None, float("-inf")
    for rank, windows in enumerate(passages):
        for r in windows:
            s = rule.score(r, rank)
            if best is None or s > best_score:
                best, best_score = r, s
    return best


@torch.no_grad()
def read_pairs(
    model: Reader,
    tokenizer: Any,
    settings: dict,
    pairs: Sequence[tuple[str, str, str]],
    max_answer_length: int = 30,
    n_best: int = 20,
    batch_size: int = 32,
    precision: str = "auto",
    progress: bool = True,
) -> list[list[Reading]]:
    """The window readings of each ``(question, title, text)`` pair, in order (window order within a
    pair; an empty list for a passage with nothing to read); ``progress``: a tqdm bar over the windows."""
    wkw = {k: settings[k] for k in ("max_length", "stride", "max_question_length")}
    windows, owner = [], []
    for i, (question, title, text) in enumerate(pairs):
        for w in make_windows(tokenizer, question, title if settings.get("title", True) else "", text, (), **wkw):
            windows.append(w)
            owner.append(i)
    found: list[dict[int, Reading]] = [{} for _ in pairs]
    device = next(model.parameters()).device
    autocast = autocast_context(device, precision)  # the one rule (dpr.trainkit.precision), on the model's device
    order = sorted(range(len(windows)), key=lambda j: len(windows[j].input_ids))
    bar = tqdm(total=len(order), desc="reader: read", unit="window", disable=not progress or not order)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        length = max(len(windows[j].input_ids) for j in idx)
        ids = torch.full((len(idx), length), tokenizer.pad_token_id, dtype=torch.long)
        types = torch.zeros_like(ids)
        attn = torch.zeros_like(ids)
        passage = torch.zeros(ids.shape, dtype=torch.bool)
        for r, j in enumerate(idx):
            w = windows[j]
            ids[r, :len(w.input_ids)] = torch.tensor(w.input_ids)
            types[r, :len(w.input_ids)] = torch.tensor(w.token_type_ids)
            attn[r, :len(w.input_ids)] = 1
            passage[r, w.first:w.last + 1] = True
        with autocast:
            start, end, rel = model(ids.to(device), attn.to(device), passage.to(device), types.to(device))
        start, end, rel = start.float().cpu().numpy(), end.float().cpu().numpy(), rel.float().cpu().numpy()
        for r, j in enumerate(idx):
            w = windows[j]
            span = best_spans(start[r], end[r], w.first, w.last, max_answer_length, n_best)[0]
            a, z = w.char_span(span.start, span.end)
            found[owner[j]][j] = Reading(pairs[owner[j]][2][a:z], span.score, float(rel[r]),
                                         _log_norm(start[r], end[r], w.first, w.last))
        bar.update(len(idx))
    bar.close()
    return [[by_window[j] for j in sorted(by_window)] for by_window in found]


def _log_norm(start: np.ndarray, end: np.ndarray, first: int, last: int) -> float:
    """logsumexp of start logits + of end logits over passage tokens ``first..last`` (float64)."""
    def lse(x: np.ndarray) -> float:
        x = np.asarray(x[first:last + 1], dtype=np.float64)
        m = x.max()
        return float(m + np.log(np.exp(x - m).sum()))
    return lse(start) + lse(end)
