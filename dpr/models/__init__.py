"""Bi-encoder models: towers, pooling, save/load and inference encoding.

Import from here: ``from dpr.models import BiEncoder, BiEncoderConfig, load_biencoder, encode_texts``.
"""

from dpr.models.biencoder import BiEncoder, BiEncoderConfig
from dpr.models.encode_options import EncodeOptions
from dpr.models.inference import encode_texts, iter_encode_batches
from dpr.models.io import (
    build_biencoder,
    is_biencoder_dir,
    load_biencoder,
    load_weights,
    read_biencoder_config,
    save_biencoder,
    save_weights,
)
from dpr.models.pooling import cls_pool, detect_pooling, last_token_pool, mean_pool, pool
from dpr.models.protocol import DenseEncoder, find_encoder, is_encoder, unwrap_encoder

__all__ = [
    "BiEncoder",
    "BiEncoderConfig",
    "DenseEncoder",
    "EncodeOptions",
    "build_biencoder",
    "cls_pool",
    "detect_pooling",
    "encode_texts",
    "find_encoder",
    "is_encoder",
    "is_biencoder_dir",
    "iter_encode_batches",
    "last_token_pool",
    "load_biencoder",
    "load_weights",
    "mean_pool",
    "pool",
    "read_biencoder_config",
    "save_biencoder",
    "save_weights",
    "unwrap_encoder",
]
