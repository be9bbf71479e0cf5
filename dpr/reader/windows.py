"""Question + passage → token windows, and answers between characters and tokens.

A passage longer than ``max_length`` is cut into overlapping windows (``stride`` tokens shared by
neighbours) by the fast tokenizer itself (``return_overflowing_tokens``); its offset mapping gives,
for every passage token, the characters it covers in the passage text, so an answer's character span
maps to a token span and back exactly. The overlap is capped at half of the room a window leaves for
the passage (a long question leaves less). An answer whose span no window holds whole is reported as
such (``Window.answer_spans`` empty in every window), never silently dropped.

Layout (as DPR's reader): ``[CLS] question [SEP] title [SEP] passage [SEP]``: question and title form
the first segment, so only passage tokens carry offsets and can be answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class Window:
    """One model input: token ids, the passage-token range, and their character offsets."""

    input_ids: list[int]
    token_type_ids: list[int]
    offsets: list[tuple[int, int] | None]   # passage text characters per token; None outside the passage
    first: int                              # first passage token
    last: int                               # last passage token (inclusive)
    answer_spans: list[tuple[int, int]] = field(default_factory=list)  # gold token spans (inclusive)

    def char_span(self, start: int, end: int) -> tuple[int, int]:
        """The passage characters ``[a, b)`` covered by tokens ``start..end`` (inclusive)."""
        return self.offsets[start][0], self.offsets[end][1]


def find_answer_spans(text: str, answers: Sequence[str]) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of every occurrence of every answer in ``text``.

    Matches are whole words where the answer begins/ends with a word character ("an" is not found in
    "plant"); exact case first, any case when an answer occurs with no exact-case match.
    """
    spans: list[tuple[int, int]] = []
    for ans in answers:
        ans = ans.strip()
        if not ans:
            continue
        pattern = (r"(?<!\w)" if re.match(r"\w", ans) else "") + re.escape(ans) + (r"(?!\w)" if re.search(r"\w$", ans) else "")
        found = [m.span() for m in re.finditer(pattern, text)]
        if not found:
            found = [m.span() for m in re.finditer(pattern, text, flags=re.IGNORECASE)]
        spans.extend(s for s in found if s not in spans)
    return sorted(spans)


def char_to_token_span(window: Window, start: int, end: int) -> tuple[int, int] | None:
    """Token span (inclusive) of characters ``[start, end)``, or None unless the window holds it whole.

    The start token is the one covering ``start`` (or the first after it, if ``start`` is a space);
    the end token the last one starting before ``end``.
    """
    lo, hi = window.offsets[window.first], window.offsets[window.last]
    if start < lo[0] or end > hi[1] or end <= start:
        return None
    ts = te = None
    for t in range(window.first, window.last + 1):
        a, b = window.offsets[t]
        if b == a:  # zero-width tokens never start or end an answer
            continue
        if ts is None and b > start:
            ts = t
        if a < end:
            te = t
    if ts is None or te is None or te < ts:
        return None
    return ts, te


def make_windows(
    tokenizer,
    question: str,
    title: str,
    text: str,
    answer_chars: Sequence[tuple[int, int]] = (),
    max_length: int = 256,
    stride: int = 64,
    max_question_length: int = 64,
) -> list[Window]:
    """The windows of one (question, passage) pair, each with the answer spans it holds whole."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("the reader needs a fast tokenizer (offset mapping)")
    if not text.strip():
        return []  # nothing to read (results files may hold empty passages)
    q_ids = tokenizer(question, add_special_tokens=False, truncation=True, max_length=max_question_length)["input_ids"]
    first_segment = tokenizer.decode(q_ids)
    if title:
        first_segment = f"{first_segment} {tokenizer.sep_token} {title}"
    room = max_length - len(tokenizer(first_segment, add_special_tokens=False)["input_ids"]) \
        - tokenizer.num_special_tokens_to_add(pair=True)
    if room < 1:
        raise ValueError(f"max_length={max_length} leaves no room for the passage after the question and title")
    # the overlap must be smaller than the passage room, or windows would not advance: at most half of it
    stride = min(stride, room // 2)
    enc = tokenizer(
        first_segment, text, truncation="only_second", max_length=max_length, stride=stride,
        return_overflowing_tokens=True, return_offsets_mapping=True, padding=False,
    )
    windows = []
    for w in range(len(enc["input_ids"])):
        seq_ids = enc.sequence_ids(w)
        ctx = [t for t, s in enumerate(seq_ids) if s == 1]
        if not ctx:  # only spaces or characters the tokenizer drops
            continue
        offsets = [tuple(o) if s == 1 else None for o, s in zip(enc["offset_mapping"][w], seq_ids)]
        types = enc["token_type_ids"][w] if "token_type_ids" in enc else [0] * len(seq_ids)
        win = Window(list(enc["input_ids"][w]), list(types), offsets, ctx[0], ctx[-1])
        for a, b in answer_chars:
            span = char_to_token_span(win, a, b)
            if span is not None and span not in win.answer_spans:
                win.answer_spans.append(span)
        windows.append(win)
    return windows
