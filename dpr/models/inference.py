"""Batched inference encoding, shared by validation during training and passage export.

Texts are tokenized once and sorted by their token count, so each batch pads only to its own longest
text. Sorting by characters, as sentence-transformers' ``encode`` does (``length_sort="chars"``), fills
only 73% of the padded positions with tokens on squad1_open's 3,526 passages in batches of 64, because a
text's tokens per character vary and a batch pads to its most token-dense member; by tokens, 97%
(`length_sort` below). Batches are encoded under ``torch.inference_mode``
with bf16 autocast where the hardware supports it (`dpr.trainkit.precision`, the project's one precision
rule), and returned in the caller's order.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from dpr.models.encode_options import EncodeOptions, encode_options
# the tokenisation helpers live in dpr.models.tokenization; these names stay importable from here
from dpr.models.tokenization import pad_tokenized, tokenize_batch, tokenize_each, with_prefix  # noqa: F401
from dpr.models.protocol import unwrap_encoder
from dpr.trainkit.precision import autocast_context

if TYPE_CHECKING:
    from dpr.models.token_cache import TokenTable

log = logging.getLogger(__name__)

TOWERS = ("question", "passage")


LENGTH_SORTS = ("tokens", "chars", "none")
# Texts tokenized ahead at a time under length_sort="tokens", and sorted within: memory stays flat however many
# texts a caller hands over (the frozen-index cache encodes a whole training corpus in one call).
TOKENIZE_CHUNK = 16_384


def check_length_sort(length_sort: str) -> None:
    """One-line ValueError unless ``length_sort`` is one of :data:`LENGTH_SORTS` (callers check before any work)."""
    if length_sort not in LENGTH_SORTS:
        raise ValueError(f"length_sort must be one of {LENGTH_SORTS}, got {length_sort!r}")


def length_batches(lengths: Sequence[int], batch_size: int, sort_by_length: bool = True) -> list[list[int]]:
    """The positions of each batch, in encoding order: by ``lengths``, longest first (equal lengths in input
    order), so each batch pads only to its own longest; in input order without ``sort_by_length``."""
    # Longest first: the first batch shows the peak memory right away, not at the end of a long run.
    order = (sorted(range(len(lengths)), key=lambda i: int(lengths[i]), reverse=True) if sort_by_length
             else list(range(len(lengths))))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def batch_positions(texts: Sequence[str], titles: Sequence[str] | None, batch_size: int,
                    sort_by_length: bool = True) -> list[list[int]]:
    """:func:`length_batches` by the characters of text + title (``length_sort=chars``, the peer's rule)."""
    return length_batches([len(t) + (len(titles[i]) if titles is not None else 0) for i, t in enumerate(texts)],
                          batch_size, sort_by_length)


def _unwrap(model: nn.Module) -> nn.Module:
    return unwrap_encoder(model)  # the dense encoder inside any DDP wrapper (TypeError when there is none)


def iter_encode_batches(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    tower: str,
    options: EncodeOptions | None = None,
    *,
    titles: Sequence[str] | None = None,
    **fields: Any,
) -> Iterator[tuple[list[int], torch.Tensor]]:
    """Yield ``(positions, vectors)`` per batch: row k of ``vectors`` (float32, CPU) encodes
    ``texts[positions[k]]``. Batches come in length order, not input order (see :func:`encode_texts`).

    ``options`` (:class:`~dpr.models.encode_options.EncodeOptions`; its fields may also be given as keywords,
    which override it): the model is put in eval mode for the duration (dropout off) and restored afterwards;
    with ``device`` given it is moved there (in place). ``runner`` replaces the tower's forward (called with
    the tokenizer's tensors, e.g. an ONNX Runtime session, `dpr.models.onnx_runtime`); autocast does not
    apply to it. ``length_sort`` (:data:`LENGTH_SORTS`): ``tokens`` tokenizes every text once up front and
    batches them by token count; ``chars`` by characters, tokenizing batch by batch (sentence-transformers'
    rule); ``none`` in input order. The vectors are the same up to rounding; only the padding differs.
    ``tokens``: the texts' token ids, tokenised once (`dpr.models.token_cache`, made with this tower's max length
    and prefix): batched by token count from it without calling the tokenizer (where it lacks a text, as without).
    """
    opts = encode_options(options, fields)
    _check_request(texts, tower, titles, opts)
    bi = _unwrap(model)
    max_length = opts.max_length
    if max_length is None:
        max_length = bi.config.question_max_length if tower == "question" else bi.config.passage_max_length
    dev = torch.device(opts.device) if opts.device is not None else bi.device
    if bi.device != dev:
        bi.to(dev)
    encode = opts.runner or (bi.encode_questions if tower == "question" else bi.encode_passages)
    autocast = "off" if opts.runner is not None else opts.autocast

    was_training = bi.training
    bi.eval()
    try:
        with tqdm(total=len(texts), desc=f"encode {tower}s", unit="text", disable=not opts.progress) as bar:
            for idx, batch in padded_batches(tokenizer, texts, titles, opts.batch_size, max_length,
                                              bi.config.prefix(tower), opts.length_sort, opts.tokens):
                inputs = {k: batch[k].to(dev) for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
                # Grad/autocast modes are thread-wide: enter them per batch, never across the yield,
                # or they would leak into the consumer's code while this generator is suspended.
                with torch.inference_mode(), autocast_context(dev, autocast):
                    vecs = encode(**inputs).float().cpu()
                # A clone made outside inference mode is an ordinary tensor (inference tensors
                # refuse later use in autograd, e.g. as a validation score's input).
                yield idx, vecs.clone()
                bar.update(len(idx))
    finally:
        bi.train(was_training)


def _check_request(texts: Sequence[str], tower: str, titles: Sequence[str] | None, opts: EncodeOptions) -> None:
    # One-line ValueErrors before any work, in the order a caller reads its own call.
    if tower not in TOWERS:
        raise ValueError(f"tower must be one of {TOWERS}, got {tower!r}")
    check_length_sort(opts.length_sort)
    if titles is not None and len(titles) != len(texts):
        raise ValueError(f"{len(titles)} titles for {len(texts)} texts")
    if opts.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {opts.batch_size}")


def padded_batches(tokenizer: Any, texts: Sequence[str], titles: Sequence[str] | None, batch_size: int,
                    max_length: int, prefix: str, length_sort: str,
                    tokens: "TokenTable | None" = None) -> Iterator[tuple[list[int], dict]]:
    """``(positions, padded inputs)`` per batch, in encoding order: the batches :func:`iter_encode_batches`
    feeds the tower (``prefix`` already the tower's; ``length_sort`` and ``tokens`` as there)."""
    rows = tokens.rows(texts, titles) if tokens is not None and length_sort == "tokens" else None
    if rows is not None:  # the same batches as below (chunk by chunk), padded from the cached ids
        for start in range(0, len(rows), TOKENIZE_CHUNK):
            chunk = rows[start:start + TOKENIZE_CHUNK]
            for idx in length_batches(tokens.lengths(chunk).tolist(), batch_size):
                yield [start + i for i in idx], tokens.pad([chunk[i] for i in idx])
        return
    if length_sort != "tokens":
        for idx in batch_positions(texts, titles, batch_size, length_sort != "none"):
            yield idx, tokenize_batch(tokenizer, [texts[i] for i in idx],
                                      [titles[i] for i in idx] if titles is not None else None, max_length, prefix)
        return
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        end = min(start + TOKENIZE_CHUNK, len(texts))
        rows = tokenize_each(tokenizer, texts[start:end], titles[start:end] if titles is not None else None,
                             max_length, prefix)
        for idx in length_batches([len(r["input_ids"]) for r in rows], batch_size):
            yield [start + i for i in idx], pad_tokenized(tokenizer, [rows[i] for i in idx])


def encode_texts(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    tower: str,
    options: EncodeOptions | None = None,
    *,
    titles: Sequence[str] | None = None,
    **fields: Any,
) -> torch.Tensor:
    """Encode ``texts`` with the question or passage tower: float32 ``[N, D]`` on the CPU, input order.

    ``titles`` (passages) are encoded as (title, text) pairs. ``options``
    (:class:`~dpr.models.encode_options.EncodeOptions`, or its fields as keywords, which override it):
    ``max_length`` defaults to the config's length for the tower; ``autocast`` as in
    :func:`dpr.trainkit.precision.autocast_dtype`; ``runner``, ``length_sort`` and ``tokens`` (token ids cached
    once) as in :func:`iter_encode_batches`.
    """
    bi = _unwrap(model)
    out = torch.empty((len(texts), bi.dim), dtype=torch.float32)
    for idx, vecs in iter_encode_batches(bi, tokenizer, texts, tower, encode_options(options, fields), titles=titles):
        out[torch.as_tensor(idx, dtype=torch.long)] = vecs
    return out
