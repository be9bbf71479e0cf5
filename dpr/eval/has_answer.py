"""DPR's answer matcher: does a passage contain one of a question's answers?

This reproduces ``dpr/data/qa_validation.py`` of facebookresearch/DPR so that top-k figures are comparable
with the paper's:

- ``string`` mode: both sides are NFD-normalised and split by DPR's ``SimpleTokenizer`` into runs of
  letters/digits/combining marks and single non-space symbols, lower-cased; an answer matches when its
  token sequence occurs contiguously in the passage's tokens ("in Honolulu" is not in "at Honolulu",
  "Honolulu" is in "HONOLULU!", "1,000" is in "about 1,000 men" but "1000" is not).
- ``regex`` mode (CuratedTREC): each answer is a regular expression searched in the NFD text with
  IGNORECASE|UNICODE|MULTILINE; a pattern that does not compile never matches.

One deliberate difference: an answer that tokenizes to nothing (empty or only spaces) never matches;
DPR's loop would report such an answer as found in every passage.

A leaf module: only the standard library and ``regex``.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Sequence

import regex

# DPR's SimpleTokenizer: ALPHA_NUM | NON_WS, with IGNORECASE|UNICODE|MULTILINE.
_TOKEN_RE = regex.compile(
    r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])",
    flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE,
)

# Tokens never contain control characters (\p{C}), so joining with one turns "token sequence occurs
# contiguously" into a plain substring test, which runs in C instead of a Python loop over positions.
_SEP = "\x1f"

MODES = ("string", "regex")


def normalize(text: str) -> str:
    """DPR's ``_normalize``: Unicode NFD."""
    return unicodedata.normalize("NFD", text)


def tokenize(text: str) -> list[str]:
    """DPR's SimpleTokenizer words, uncased, after NFD normalisation."""
    return [m.group().lower() for m in _TOKEN_RE.finditer(normalize(text))]


def token_string(text: str) -> str:
    """``text``'s tokens joined and framed by a separator: a token sequence occurs contiguously in a passage
    exactly when its token string is a substring of the passage's."""
    return _SEP + _SEP.join(tokenize(text)) + _SEP


@functools.lru_cache(maxsize=1 << 15)
def _haystack(text: str) -> str:
    # A passage is checked against every question that retrieved it; cache its tokenization.
    return token_string(text)


@functools.lru_cache(maxsize=1 << 16)
def _needle(answer: str) -> str | None:
    needle = token_string(answer)
    return None if needle == _SEP + _SEP else needle


@functools.lru_cache(maxsize=1 << 12)
def _compile(pattern: str) -> re.Pattern | None:
    try:
        return re.compile(normalize(pattern), flags=re.IGNORECASE | re.UNICODE | re.MULTILINE)
    except (re.error, TypeError, ValueError, OverflowError, RecursionError):
        # DPR catches every exception here: a bad CuratedTREC pattern is simply "not found".
        return None


def has_answer(answers: Sequence[str], text: str, mode: str = "string") -> bool:
    """True when ``text`` contains one of ``answers`` (see the module docstring for the rules)."""
    if mode == "string":
        haystack = _haystack(text)
        for answer in answers:
            needle = _needle(answer)
            if needle is not None and needle in haystack:
                return True
        return False
    if mode == "regex":
        normalized = normalize(text)
        for pattern in answers:
            compiled = _compile(pattern)
            if compiled is not None and compiled.search(normalized) is not None:
                return True
        return False
    raise ValueError(f"unknown match mode {mode!r}; expected one of {MODES}")
