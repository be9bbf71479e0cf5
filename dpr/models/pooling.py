"""Turning token states into one vector: CLS (DPR's choice), masked mean (sentence-transformers'), or the last
real token (decoder-only LLM embedders: ``last``; ``eos`` is the same pooling over inputs that end in an appended
EOS token, as RepLLaMA and e5-mistral train, see `dpr.models.eos_tokenizer`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

import torch

log = logging.getLogger(__name__)

POOLING_MODES = ("cls", "mean", "last", "eos")
# Poolings that read the last real token: the tokenizer must not cut it off, and decoders pad on the left.
LAST_TOKEN_POOLINGS = ("last", "eos")


def cls_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The first token's state (``[CLS]``); assumes right padding, as BERT-style tokenizers do."""
    return hidden[:, 0]


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the states of real tokens only: padding must not dilute short texts."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * mask).sum(dim=1)
    counts = mask.sum(dim=1).clamp(min=1e-9)
    return summed / counts


def last_token_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The state of each row's last real token, under right or left padding (or none).

    The position is the last 1 of the attention mask, found per row, so the same text gives the same
    vector whichever side its batch was padded on (a causal model's last token has seen the whole input).
    """
    length = attention_mask.shape[1]
    # argmax finds the first maximum: over the flipped mask that is the last real token
    last = (length - 1) - attention_mask.flip(dims=[1]).to(torch.int64).argmax(dim=1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last.to(hidden.device)]


_POOLERS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "cls": cls_pool, "mean": mean_pool, "last": last_token_pool, "eos": last_token_pool}


def check_pooling(mode: str, decoder: bool, padding_side: str | None, name: str = "model") -> None:
    """Refuse (ValueError, one line) the settings under which the pooled vector cannot tell texts apart:

    - ``cls`` on a decoder-only model: under causal attention the first token sees nothing after it, so the vector
      is a function of the first token alone (every passage starting with the same word, or the same padding
      under left padding, gets one vector: 2 distinct vectors for 200 passages);
    - ``cls`` with ``padding_side=left``: the first position of every shorter row is padding.
    """
    if mode == "cls" and decoder:
        raise ValueError(f"{name}.pooling=cls on a decoder-only model: its first token attends to nothing after it, "
                         "so every text starting alike gets the same vector; use pooling=last or eos (or mean)")
    if mode == "cls" and padding_side == "left":
        raise ValueError(f"{name}.pooling=cls with {name}.padding_side=left: the first position of every shorter "
                         "text is padding, so they share one vector; pad on the right, or use pooling=mean")


COLLAPSE_SAMPLE = 64  # passages encoded by `check_not_collapsed`


def check_not_collapsed(model: torch.nn.Module, tokenizer, examples, where: str) -> None:
    """Refuse (ValueError, one line) to call a trained model done when its passage vectors cannot tell texts apart:
    the first positive passage of up to :data:`COLLAPSE_SAMPLE` training ``examples`` (retriever JSON records),
    encoded; fewer distinct vectors (cosine < 1 - 1e-6 to every earlier one) than a quarter of the distinct texts
    is a collapse (a pooling the settings check missed, or training that diverged to one point)."""
    from dpr.models.inference import encode_texts

    texts: list[str] = []
    for ex in examples:
        for ctx in (ex.get("positive_ctxs") or [])[:1]:
            if ctx.get("text", "").strip() and ctx["text"] not in texts:
                texts.append(ctx["text"])
        if len(texts) >= COLLAPSE_SAMPLE:
            break
    if len(texts) < 4:
        return
    device, training = next(model.parameters()).device, model.training
    model.eval()  # no dropout: the vectors the saved model gives
    try:
        vectors = torch.nn.functional.normalize(
            encode_texts(model, tokenizer, texts, "passage", device=device, autocast="off").float(), dim=-1)
    finally:
        model.train(training)
    sims = (vectors @ vectors.T).tril(diagonal=-1)
    distinct = int((sims.max(dim=1).values < 1 - 1e-6).sum()) if len(texts) > 1 else 1
    if distinct < len(texts) // 4:
        raise ValueError(f"{where}: the trained model gives {distinct} distinct vectors for {len(texts)} different "
                         "training passages: its vectors cannot tell texts apart (check model.pooling for this "
                         "backbone, and the learning rate); the run is not marked finished")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """``[B, L, H]`` token states -> ``[B, H]`` by ``mode`` (one of :data:`POOLING_MODES`)."""
    try:
        fn = _POOLERS[mode]
    except KeyError:
        raise ValueError(f"pooling must be one of {POOLING_MODES}, got {mode!r}") from None
    return fn(hidden, attention_mask)


def detect_pooling(model_path: str | Path) -> str | None:
    """The pooling a sentence-transformers model directory was trained with, or None if not one.

    Reads ``modules.json`` to find the Pooling module's folder (``1_Pooling`` conventionally) and
    its ``config.json``. Returns "mean", "cls" or "last"; None for plain HF models, hub names that are
    not local directories, or pooling modes this package does not implement (e.g. max).
    """
    root = Path(model_path)
    if not root.is_dir():
        return None
    folders: list[Path] = []
    modules = root / "modules.json"
    if modules.is_file():
        try:
            for m in json.loads(modules.read_text(encoding="utf-8")):
                if str(m.get("type", "")).endswith("Pooling"):
                    folders.append(root / m.get("path", ""))
        except (json.JSONDecodeError, AttributeError, TypeError):
            log.warning("ignoring unreadable %s", modules)
    folders.append(root / "1_Pooling")
    for folder in folders:
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            continue
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            log.warning("ignoring unreadable %s", cfg_path)
            continue
        if cfg.get("pooling_mode_mean_tokens"):
            return "mean"
        if cfg.get("pooling_mode_cls_token"):
            return "cls"
        if cfg.get("pooling_mode_lasttoken"):
            return "last"
        if cfg.get("pooling_mode") in POOLING_MODES:
            return cfg["pooling_mode"]
        return None
    return None
