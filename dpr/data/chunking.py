"""DPR's passage convention: a text is cut into consecutive chunks of N whitespace-separated words
(N=100 for DPR's Wikipedia psgs_w100), each chunk re-joined with single spaces."""

from __future__ import annotations

import bisect
import re
from typing import NamedTuple

_WORD = re.compile(r"\S+")


class Chunks(NamedTuple):
    texts: list[str]  # the chunk texts, words joined by one space
    starts: list[int]  # character offset in the original text of each chunk's first word
    ends: list[int]  # character offset just past each chunk's last word


def chunk_words(text: str, words_per_passage: int) -> Chunks:
    """Split ``text`` into chunks of ``words_per_passage`` words (the last one may be shorter)."""
    if words_per_passage < 1:
        raise ValueError(f"words_per_passage must be >= 1, got {words_per_passage}")
    spans = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    texts, starts, ends = [], [], []
    for i in range(0, len(spans), words_per_passage):
        group = spans[i : i + words_per_passage]
        texts.append(" ".join(text[s:e] for s, e in group))
        starts.append(group[0][0])
        ends.append(group[-1][1])
    return Chunks(texts, starts, ends)


def chunk_of_span(chunks: Chunks, start: int, answer: str) -> tuple[int, bool]:
    """The chunk holding the span ``[start, start+len(answer))`` of the original text, and whether
    the whole span fits in it.

    A span straddling a chunk boundary is assigned to the chunk holding its start (its first
    non-space character): DPR's positive is the passage where a reader would begin to find it.
    """
    lead = len(answer) - len(answer.lstrip())
    first = start + lead
    idx = max(bisect.bisect_right(chunks.starts, first) - 1, 0)
    end = start + len(answer.rstrip())
    return idx, end <= chunks.ends[idx]
