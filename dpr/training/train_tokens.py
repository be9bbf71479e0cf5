"""The training data's token ids, tokenised once (`dpr.models.token_cache`): batches are padded from them.

:func:`train_tokens` gives the two tables of a training file (its questions; every passage its examples name:
positives, mined and listed negatives, which are also the pool that tops up short questions), cached on disk beside
the file. :func:`collate_from` pads a batch from them: the tensors :func:`collate` makes by calling the tokenizer
(same ids, same padding; tests/training/test_loader.py), or None where a text is missing (the caller then
tokenises that batch).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

import torch

from dpr.models.token_cache import TokenTable, cached_table

if TYPE_CHECKING:
    from dpr.training.items import TrainItem

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

    def pairs():  # streamed, one example at a time (an ExampleFile never holds the whole file)
        return ((c["text"], c.get("title") or "") for ex in examples for key in CTX_KEYS for c in ex.get(key) or ())

    passages, reused_p = cached_table(data_file, "passages", tokenizer, None, None, pairs=pairs, has_titles=True,
                                      max_length=passage_max_length, prefix=passage_prefix, write=write)
    log.info("token ids of %s: %d questions, %d passages (%s) in %.1f s", data_file, len(questions), len(passages),
             "cached" if reused_q and reused_p else "tokenised", time.perf_counter() - start)
    return TrainTokens(questions, passages)


def collate(
    items: Sequence["TrainItem"],
    tokenizer,
    question_max_length: int,
    passage_max_length: int,
    passages: bool = True,
    question_prefix: str = "",
    passage_prefix: str = "",
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """Tokenise a batch, padded to its own longest sequence: ``(q_inputs, p_inputs)``.

    Passages are (title, text) pairs as in DPR; ``p_inputs`` holds ``len(items) * (1 + H)`` rows,
    question ``i``'s positive at row ``i * (1 + H)``. The prefixes are the model's
    (``BiEncoderConfig.question_prefix`` / ``passage_prefix``).
    """
    # The same tokenisation as inference (dpr.models.inference), so training and export agree.
    from dpr.models.inference import tokenize_batch

    ctxs = [c for it in items for c in it.passages]
    q = tokenize_batch(tokenizer, [it.question for it in items], None, question_max_length, prefix=question_prefix)
    if not passages:
        return q, None
    p = tokenize_batch(tokenizer, [c["text"] for c in ctxs], [c.get("title") or "" for c in ctxs], passage_max_length,
                       prefix=passage_prefix)
    return q, p


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


def validation_tokens(tc: Any, tokenizer: Any, model_cfg: Any, paths: Any, dev_examples: Sequence[dict],
                      corpus: tuple[list[str], list[str], list[str]] | None, write: bool) -> dict[str, TokenTable]:
    """The dev questions' and the validation corpus's token tables (cached beside ``dev.json`` and ``passages.tsv``),
    so each validation of a run encodes without tokenising; none where ``train.token_cache`` is false."""
    if tc.token_cache is False:
        return {}
    out = {"questions": cached_table(paths.dev, "questions", tokenizer, [ex["question"] for ex in dev_examples], None,
                                     max_length=model_cfg.question_max_length, prefix=model_cfg.question_prefix,
                                     write=write)[0]}
    if corpus is not None and tc.val_corpus_topk:
        out["corpus"] = cached_table(paths.passages, "corpus", tokenizer, corpus[1], corpus[2],
                                     max_length=model_cfg.passage_max_length, prefix=model_cfg.passage_prefix,
                                     write=write)[0]
    return out
