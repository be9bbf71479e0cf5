"""The tests' keyword shorthand for `dpr.encode.encode_corpus` and `dpr.encode.save_encoded`, which take their
settings whole (an `EncodeConfig`): ``encode_corpus(model, passages, out, dtype="float32", shard_id=1)`` splits the
keywords into the EncodeConfig fields and the call's own arguments (shard_id, num_shards, cache_dir, progress,
computed_with). A keyword that is neither is a TypeError, as it was for the function itself."""

from __future__ import annotations

import dataclasses
from typing import Any

from dpr import encode
from dpr.encode_config import EncodeConfig

_SETTINGS = {f.name for f in dataclasses.fields(EncodeConfig)}


def _split(kw: dict[str, Any]) -> tuple[EncodeConfig, dict[str, Any]]:
    return (EncodeConfig(**{k: v for k, v in kw.items() if k in _SETTINGS}),
            {k: v for k, v in kw.items() if k not in _SETTINGS})


def encode_corpus(model_path, passages_path, output_dir, **kw: Any):
    config, own = _split(kw)
    return encode.encode_corpus(model_path, passages_path, output_dir, config, **own)


def save_encoded(model_path, passages_path, output_dir, ids, vectors, **kw: Any) -> bool:
    config, own = _split(kw)
    return encode.save_encoded(model_path, passages_path, output_dir, ids, vectors, config, **own)
