"""Training examples for the reader from DPR retriever JSON, and their batches.

Each question gives one positive window (the first gold passage whose window holds an answer whole,
with every answer occurrence in it as a gold span) and up to ``negatives`` windows of passages without
any answer (``hard_negative_ctxs`` first, then ``negative_ctxs``), drawn afresh each step from a
seeded generator, so that the relevance head learns to rank the gold passage first (DPR's reader).
Questions that cannot be used are counted by reason, never silently dropped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from dpr.reader.windows import Window, find_answer_spans, make_windows


@dataclass
class TrainItem:
    question: str
    positive: Window
    negatives: list[tuple[str, str]]  # (title, text) of passages holding no answer


@dataclass
class PrepCounts:
    questions: int = 0
    used: int = 0
    no_positive: int = 0               # no gold passage at all
    answer_not_in_passage: int = 0     # gold passages, but no answer string in any of them
    answer_outside_windows: int = 0    # the answer is in a gold passage but no window holds it whole
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "extra"} | self.extra


def window_kwargs(settings: dict) -> dict:
    return {k: settings[k] for k in ("max_length", "stride", "max_question_length")}


def prepare_items(records: Sequence[dict], tokenizer: Any, settings: dict) -> tuple[list[TrainItem], PrepCounts]:
    """Training items from retriever-JSON records (see the module docstring)."""
    counts = PrepCounts(questions=len(records))
    items = []
    use_title = bool(settings["title"])
    for rec in records:
        answers = rec["answers"]
        if not rec["positive_ctxs"]:
            counts.no_positive += 1
            continue
        chosen, found_text = None, False
        for ctx in rec["positive_ctxs"]:
            chars = find_answer_spans(ctx["text"], answers)
            if not chars:
                continue
            found_text = True
            title = ctx.get("title", "") if use_title else ""
            wins = [w for w in make_windows(tokenizer, rec["question"], title, ctx["text"], chars,
                                            **window_kwargs(settings)) if w.answer_spans]
            if wins:
                chosen = wins[0]
                break
        if chosen is None:
            if found_text:
                counts.answer_outside_windows += 1
            else:
                counts.answer_not_in_passage += 1
            continue
        negatives = [(c.get("title", "") if use_title else "", c["text"])
                     for c in [*rec.get("hard_negative_ctxs", []), *rec.get("negative_ctxs", [])]
                     if c["text"].strip() and not find_answer_spans(c["text"], answers)]
        items.append(TrainItem(rec["question"], chosen, negatives))
        counts.used += 1
    return items, counts


def collate(items: Sequence[TrainItem], tokenizer: Any, settings: dict, negatives: int,
            rng: random.Random) -> dict[str, Any]:
    """A batch of ``len(items)`` questions × ``1 + negatives`` passage slots (positive in slot 0).

    Questions with fewer negatives than slots get empty slots (``slot_mask`` False), excluded from the
    relevance softmax.
    """
    slots = 1 + negatives
    windows: list[Window | None] = []
    for item in items:
        windows.append(item.positive)
        picked = rng.sample(item.negatives, min(negatives, len(item.negatives)))
        for title, text in picked:
            windows.append(make_windows(tokenizer, item.question, title, text, (), **window_kwargs(settings))[0])
        windows.extend([None] * (negatives - len(picked)))
    length = max(len(w.input_ids) for w in windows if w is not None)
    n = len(windows)
    input_ids = torch.full((n, length), tokenizer.pad_token_id, dtype=torch.long)
    token_types = torch.zeros((n, length), dtype=torch.long)
    attention = torch.zeros((n, length), dtype=torch.long)
    passage = torch.zeros((n, length), dtype=torch.bool)
    slot_mask = torch.zeros(n, dtype=torch.bool)
    for i, w in enumerate(windows):
        if w is None:
            attention[i, 0] = 1  # an empty slot still needs one attended token to run the encoder
            continue
        m = len(w.input_ids)
        input_ids[i, :m] = torch.tensor(w.input_ids)
        token_types[i, :m] = torch.tensor(w.token_type_ids)
        attention[i, :m] = 1
        passage[i, w.first:w.last + 1] = True
        slot_mask[i] = True
    return {
        "input_ids": input_ids, "token_type_ids": token_types, "attention_mask": attention,
        "passage_mask": passage, "slot_mask": slot_mask.view(len(items), slots),
        "spans": [item.positive.answer_spans for item in items],
    }


def batch_share(batch: dict[str, Any], first: int, last: int) -> dict[str, Any]:
    """Questions ``first`` to ``last`` (exclusive) of a :func:`collate` batch: a torchrun rank's share of the
    global batch (collated whole on every rank, so each question's negatives are the one-process draws)."""
    slots = batch["slot_mask"].shape[1]
    rows = slice(first * slots, last * slots)
    return {**{k: batch[k][rows] for k in ("input_ids", "token_type_ids", "attention_mask", "passage_mask")},
            "slot_mask": batch["slot_mask"][first:last], "spans": batch["spans"][first:last]}


def reader_loss(start: torch.Tensor, end: torch.Tensor, relevance: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
    """Span loss on each positive window (marginal over its gold spans) + relevance cross-entropy
    over each question's passage slots (target: slot 0). Returns ``(loss, figures)``."""
    questions, slots = batch["slot_mask"].shape
    device = start.device  # every index and target where the logits are (the one device rule's device)
    pos = torch.arange(questions, device=device) * slots
    log_s = torch.log_softmax(start[pos], dim=-1)
    log_e = torch.log_softmax(end[pos], dim=-1)
    span_losses = []
    for q, spans in enumerate(batch["spans"]):
        s = torch.tensor([a for a, _ in spans], device=device)
        e = torch.tensor([b for _, b in spans], device=device)
        span_losses.append(-torch.logsumexp(log_s[q, s] + log_e[q, e], dim=0))
    span_loss = torch.stack(span_losses).mean()
    rel = relevance.view(questions, slots).masked_fill(~batch["slot_mask"].to(device), float("-inf"))
    rel_loss = torch.nn.functional.cross_entropy(rel, torch.zeros(questions, dtype=torch.long, device=device))
    rel_acc = (rel.argmax(dim=1) == 0).float().mean()
    return span_loss + rel_loss, {"span_loss": span_loss.item(), "relevance_loss": rel_loss.item(),
                                  "relevance_accuracy": float(rel_acc)}
