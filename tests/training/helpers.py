"""Test helpers for the training package."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from dpr.models.biencoder import BiEncoderConfig
from dpr.training.batching import Shard, TrainBatches
from dpr.training.config import TrainConfig

_MODEL_KEYS = ("question_max_length", "passage_max_length", "question_prefix", "passage_prefix")
_TRAIN_KEYS = {f.name for f in dataclasses.fields(TrainConfig)}


def train_batches(examples: Sequence[dict], tokenizer: Any, **kw: Any) -> TrainBatches:
    """``TrainBatches`` from flat keywords: the TrainConfig keys go into a TrainConfig, the lengths and prefixes
    into a BiEncoderConfig, ``rank``/``world_size`` into a Shard, the rest (seed, multi_positive, mask_answers, teacher,
    tokens) as is."""
    train = {k: kw.pop(k) for k in list(kw) if k in _TRAIN_KEYS and k != "mask_answers" and k != "multi_positive"}
    model = {k: kw.pop(k) for k in list(kw) if k in _MODEL_KEYS}
    shard = Shard(kw.pop("rank", 0), kw.pop("world_size", 1))
    return TrainBatches(examples, tokenizer, TrainConfig(**train), BiEncoderConfig(**model), shard=shard, **kw)
