"""Tokenisation of a tower's inputs: the model's prefix, DPR's ``[CLS] title [SEP] text [SEP]`` pairs (an empty
title: the text alone), truncation, and rows padded together. Shared by encoding (`dpr.models.inference`), the
token cache (`dpr.models.token_cache`) and training, so every path sees the same token ids."""

from __future__ import annotations

from typing import Any, Sequence

import torch


def with_prefix(texts: Sequence[str], titles: Sequence[str] | None, prefix: str) -> tuple[list[str], list[str] | None]:
    """``(texts, titles)`` with ``prefix`` put before each input's first segment: the title where there
    is one, else the text (what sentence-transformers does with a prompt and a pair)."""
    texts = list(texts)
    titles = list(titles) if titles is not None else None
    if not prefix:
        return texts, titles
    if titles is None:
        return [prefix + t for t in texts], None
    return ([t if title else prefix + t for t, title in zip(texts, titles)],
            [prefix + title if title else title for title in titles])


def tokenize_batch(
    tokenizer: Any, texts: Sequence[str], titles: Sequence[str] | None, max_length: int, prefix: str = ""
) -> dict[str, torch.Tensor]:
    """Tokenize one batch, padded to its longest member.

    With titles, each passage is the pair (title, text) -- DPR's ``[CLS] title [SEP] text [SEP]``;
    a passage with an empty title is encoded as text alone, as DPR does. ``prefix`` (the model's
    ``question_prefix`` / ``passage_prefix``) goes before each input's first segment (:func:`with_prefix`).
    """
    texts, titles = with_prefix(texts, titles, prefix)
    kw = dict(truncation=True, max_length=max_length)
    if titles is None or not any(titles):
        return dict(tokenizer(list(texts), padding="longest", return_tensors="pt", **kw))
    if all(titles):
        return dict(tokenizer(list(titles), list(texts), padding="longest", return_tensors="pt", **kw))
    # Mixed batch: tokenize each kind unpadded, then pad together in the original order.
    return pad_tokenized(tokenizer, _tokenize_rows(tokenizer, texts, titles, max_length))


def tokenize_each(tokenizer: Any, texts: Sequence[str], titles: Sequence[str] | None, max_length: int,
                  prefix: str = "") -> list[dict[str, list[int]]]:
    """Each input tokenized alone and unpadded, in input order: the rows :func:`tokenize_batch` would pad
    (:func:`pad_tokenized` of any subset equals ``tokenize_batch`` of that subset)."""
    texts, titles = with_prefix(texts, titles, prefix)
    return _tokenize_rows(tokenizer, texts, titles, max_length)


def pad_tokenized(tokenizer: Any, rows: Sequence[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Rows of :func:`tokenize_each` padded to their longest, as tensors."""
    return dict(tokenizer.pad(list(rows), padding="longest", return_tensors="pt"))


def _tokenize_rows(tokenizer: Any, texts: list[str], titles: list[str] | None,
                   max_length: int) -> list[dict[str, list[int]]]:
    # ``texts``/``titles`` already carry the prefix. An empty title: the text alone, as DPR does.
    kw = dict(truncation=True, max_length=max_length)
    if titles is None:
        titles = [""] * len(texts)
    singles = [i for i, t in enumerate(titles) if not t]
    pairs = [i for i, t in enumerate(titles) if t]
    encoded: list[dict | None] = [None] * len(texts)
    groups = []
    if singles:
        groups.append((tokenizer([texts[i] for i in singles], **kw), singles))
    if pairs:
        groups.append((tokenizer([titles[i] for i in pairs], [texts[i] for i in pairs], **kw), pairs))
    for enc, idx in groups:
        for j, i in enumerate(idx):
            encoded[i] = {k: v[j] for k, v in enc.items()}
    return encoded  # type: ignore[return-value]
