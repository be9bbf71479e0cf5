"""The training data's token ids, tokenised once (`dpr.models.token_cache`): batches are padded from them.

:func:`train_tokens` gives the two tables of a training file (its questions; every passage its examples name:
positives, mined and listed negatives, which are also the pool that tops up short questions), cached on disk beside
the file. :func:`collate_from` pads a batch from them: the tensors :func:`dpr.training.batching.collate` would
make by calling the tokenizer (same ids, same padding; tests/training/test_loader.py), or None where a text is
missing (the caller then tokenises that batch).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import torch

from dpr.models.token_cache import TokenTable, cached_table

log = logging.getLogger(__name__)

CTX_KEYS = ("positive_ctxs", "hard_negative_ctxs", "negative_ctxs")


class TrainTokens(NamedTuple):
    questions: TokenTable
    passages: TokenTable


def train_tokens(examples: Sequence[dict], tokenizer: Any, data_file: str | Path, *, question_max_length: int,
                 passage_max_length: int, question_prefix: str = "", passage_prefix: str = "",
                 write: bool = True) -> TrainTokens:
    """The tables of ``examples`` (read from ``data_file``), from the cache when up to date (``write``: cache
    what had to be built; only one process of a run should)."""
    start = time.perf_counter()
    questions, reused_q = cached_table(data_file, "questions", tokenizer, [ex["question"] for ex in examples], None,
                                       max_length=question_max_length, prefix=question_prefix, write=write)
    ctxs = [c for ex in examples for key in CTX_KEYS for c in ex.get(key) or ()]
    passages, reused_p = cached_table(data_file, "passages", tokenizer, [c["text"] for c in ctxs],
                                      [c.get("title") or "" for c in ctxs], max_length=passage_max_length,
                                      prefix=passage_prefix, write=write)
    log.info("token ids of %s: %d questions, %d passages (%s) in %.1f s", data_file, len(questions), len(passages),
             "cached" if reused_q and reused_p else "tokenised", time.perf_counter() - start)
    return TrainTokens(questions, passages)


def collate_from(tokens: TrainTokens, questions: Sequence[str], ctxs: Sequence[dict] | None
                 ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None] | None:
    """``(q_inputs, p_inputs)`` padded from the tables (``ctxs`` None: no passages), or None if one is missing."""
    q_rows = tokens.questions.rows(questions)
    if q_rows is None:
        return None
    if ctxs is None:
        return tokens.questions.pad(q_rows), None
    p_rows = tokens.passages.rows([c["text"] for c in ctxs], [c.get("title") or "" for c in ctxs])
    if p_rows is None:
        return None
    return tokens.questions.pad(q_rows), tokens.passages.pad(p_rows)
