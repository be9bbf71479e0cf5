"""Reading passages: the best span of each (question, passage) pair, and the answer across passages.

Every pair is cut into windows (as in training, with the settings the reader was trained with);
windows of all pairs are batched together by length. A passage's reading is its best window span
and its best window relevance. Across passages the answer is the span with the highest
``span_score + passage_weight * relevance``: the relevance logit (DPR's passage selector) puts the
span scores of different passages on one scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from dpr.reader.model import Reader, autocast_context
from dpr.reader.spans import best_spans
from dpr.reader.windows import make_windows


@dataclass
class Reading:
    answer: str
    span_score: float
    relevance: float

    def score(self, passage_weight: float = 1.0) -> float:
        return self.span_score + passage_weight * self.relevance


def choose(readings: Sequence[Reading], passage_weight: float = 1.0) -> int:
    """Index of the reading whose span scores highest across passages (the first on ties)."""
    if not readings:
        raise ValueError("no passage to answer from")
    scores = [r.score(passage_weight) for r in readings]
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


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
) -> list[Reading]:
    """One :class:`Reading` per ``(question, title, text)`` pair, in order."""
    wkw = {k: settings[k] for k in ("max_length", "stride", "max_question_length")}
    windows, owner = [], []
    for i, (question, title, text) in enumerate(pairs):
        for w in make_windows(tokenizer, question, title if settings.get("title", True) else "", text, (), **wkw):
            windows.append(w)
            owner.append(i)
    best: list[Reading | None] = [None] * len(pairs)
    device = next(model.parameters()).device
    autocast, _ = autocast_context(precision) if device.type == "cpu" else (torch.autocast(device.type), "")
    order = sorted(range(len(windows)), key=lambda j: len(windows[j].input_ids))
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
            text = pairs[owner[j]][2]
            cur = best[owner[j]]
            reading = Reading(text[a:z], span.score, float(rel[r]))
            if cur is None:
                best[owner[j]] = reading
            else:  # several windows of one passage: best span, best relevance
                if reading.span_score > cur.span_score:
                    cur.answer, cur.span_score = reading.answer, reading.span_score
                cur.relevance = max(cur.relevance, reading.relevance)
    # a passage with nothing to read (empty text) never wins
    return [r if r is not None else Reading("", float("-inf"), float("-inf")) for r in best]
