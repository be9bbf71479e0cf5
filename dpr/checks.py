"""Argument checks shared by the Python API, the fusion and index code and the config schemas.

Every check returns the value as the plain Python type it must be (``int`` / ``float``) or raises one
line naming the argument, what it got and the allowed range: TypeError for a wrong type (``k=2.5``,
``questions=[123]``), ValueError for a value out of range or not finite (``k=0``, ``weight=nan``).
Imports only dpr.errors (the range wording).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Mapping

from dpr.errors import describe_range  # noqa: F401 - the wording of every range message, re-exported

INT32_MAX = 2 ** 31 - 1  # FAISS and bm25s take C ints: larger values would wrap or abort


def in_range(value: float, lo: float | None, hi: float | None, lo_open: bool = False) -> bool:
    if lo is not None and (value <= lo if lo_open else value < lo):
        return False
    return hi is None or value <= hi


def check_int(name: str, value: Any, lo: int | None = 1, hi: int | None = INT32_MAX, note: str = "") -> int:
    """``value`` as an int in ``[lo, hi]``; bools, floats (even 3.0) and strings are a TypeError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if not in_range(int(value), lo, hi):
        raise ValueError(f"{name} must be an integer {describe_range(lo, hi)}{note}, got {value!r}")
    return int(value)


def check_float(name: str, value: Any, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
                note: str = "") -> float:
    """``value`` as a finite float in the range; NaN and ±inf are refused (they make rankings meaningless)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    v = float(value)
    if not math.isfinite(v) or not in_range(v, lo, hi, lo_open):
        raise ValueError(f"{name} must be a finite number {describe_range(lo, hi, lo_open)}{note}, got {value!r}")
    return v


def check_optional_int(name: str, value: Any, lo: int | None = 1, hi: int | None = INT32_MAX,
                       note: str = "") -> int | None:
    """None (meaning the documented default) or `check_int`."""
    return None if value is None else check_int(name, value, lo, hi, note)


def check_questions(questions: Any, name: str = "questions") -> list[str]:
    """A list of question strings. A single string is one question (``search("who wrote hamlet?")``
    returns one ranked list inside the outer list, as for ``["who wrote hamlet?"]``)."""
    if isinstance(questions, str):
        return [questions]
    if isinstance(questions, (bytes, bytearray, Mapping)) or not isinstance(questions, Iterable):
        raise TypeError(f"{name} must be a list of strings (or one string), got {type(questions).__name__}")
    out = list(questions)
    for i, q in enumerate(out):
        if not isinstance(q, str):
            raise TypeError(f"{name}[{i}] must be a string, got {type(q).__name__} {q!r}")
        try:
            q.encode("utf-8")
        except UnicodeEncodeError as err:  # a lone surrogate: the tokenizer would fail with a bare TypeError
            raise ValueError(f"{name}[{i}] is not valid text: {q[err.start]!r} at position {err.start} is a lone "
                             f"surrogate, not a character (question {q!r})") from None
    return out


# Limits shared by the config schemas and the Python API (one source).
SEED_MAX = 2 ** 32 - 1       # numpy's and torch's seed range
SEED = 42                    # the default seed of every command (runs, rerankers, readers)
MAX_K = 1_000_000            # passages per question; searches cap k at the corpus size anyway
MAX_BATCH = 2 ** 20
MAX_LENGTH = 2 ** 20         # tokens; the real bound is the model's max_position_embeddings (checked on load)
MAX_DIM = 65_536  # a vector size (encode.dim, dense.dims): as the projection's (dpr.models.biencoder)
MAX_SHARDS = 100_000
MAX_THREADS = 1024
MAX_RESAMPLES = 1_000_000
MAX_K1 = 1000.0              # BM25 term saturation; Lucene's useful range is 0.5-3
# Fusion: min-max normalised scores lie in [0, 1], so a weight <= 1e6 keeps dense + w·bm25 <= 1e6 + 1; raw
# scores (normalize=none) are float32 (<= 3.4e38) and 3.4e38 · 1e6 is far below float64's 1.8e308, so the
# product cannot overflow. A weight of 1e6 already ranks by BM25 alone (ties by dense): larger adds nothing.
MAX_WEIGHT = 1e6
MAX_K_RRF = 1e6              # 1/(k_rrf + rank): beyond 1e6 every passage scores the same to float precision

# Models whose position table reserves padding_idx + 1 = 2 rows (fairseq's offset): 514 rows, 512 tokens.
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "longformer")


def max_positions(encoder: Any) -> int | None:
    """The longest input (tokens) a HF encoder's position table allows, or None when it has none."""
    cfg = getattr(encoder, "config", None)
    n = getattr(cfg, "max_position_embeddings", None)
    if isinstance(n, bool) or not isinstance(n, int):
        return None
    return n - 2 if getattr(cfg, "model_type", "") in _OFFSET_POSITIONS else n


def check_max_length(max_length: Any, encoder: Any = None, name: str = "max_length") -> int | None:
    """None (the model's configured length) or tokens in [1, the encoder's max_position_embeddings]:
    0 would silently change the vectors, more than the positions fail inside the model."""
    if max_length is None:
        return None
    limit = max_positions(encoder) if encoder is not None else None
    note = " (the model's max_position_embeddings)" if limit is not None else ""
    return check_int(name, max_length, 1, limit if limit is not None else MAX_LENGTH, note)
