"""Turning token states into one vector: CLS (DPR's choice) or masked mean (sentence-transformers')."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

import torch

log = logging.getLogger(__name__)

POOLING_MODES = ("cls", "mean")


def cls_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The first token's state (``[CLS]``); assumes right padding, as BERT-style tokenizers do."""
    return hidden[:, 0]


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the states of real tokens only: padding must not dilute short texts."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * mask).sum(dim=1)
    counts = mask.sum(dim=1).clamp(min=1e-9)
    return summed / counts


_POOLERS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"cls": cls_pool, "mean": mean_pool}


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """``[B, L, H]`` token states -> ``[B, H]`` by ``mode`` ("cls" or "mean")."""
    try:
        fn = _POOLERS[mode]
    except KeyError:
        raise ValueError(f"pooling must be one of {POOLING_MODES}, got {mode!r}") from None
    return fn(hidden, attention_mask)


def detect_pooling(model_path: str | Path) -> str | None:
    """The pooling a sentence-transformers model directory was trained with, or None if not one.

    Reads ``modules.json`` to find the Pooling module's folder (``1_Pooling`` conventionally) and
    its ``config.json``. Returns "mean" or "cls"; None for plain HF models, hub names that are
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
        if cfg.get("pooling_mode") in POOLING_MODES:
            return cfg["pooling_mode"]
        return None
    return None
