"""Batches built off the training thread (`dpr.trainkit.prefetch`) are the batches built on it: the cross-encoder's
and the reader's runs give bit-identical losses and weights with and without prefetching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dpr.trainkit.prefetch import prefetched
from tests.tiny_negatives import with_negatives


def test_prefetched_yields_in_order_and_raises_where_the_step_is_consumed():
    assert list(prefetched(lambda s: s * s, range(5), depth=2)) == [0, 1, 4, 9, 16]
    assert list(prefetched(lambda s: s + 1, range(3), depth=0)) == [1, 2, 3]

    def build(step: int) -> int:
        if step == 3:
            raise ValueError("bad step 3")
        return step

    got = []
    with pytest.raises(ValueError, match="bad step 3"):
        for x in prefetched(build, range(6), depth=2):
            got.append(x)
    assert got == [0, 1, 2]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_cross_encoder_batches_are_the_same_built_ahead(tiny_model_dir, tiny_data_dir, tmp_path):
    from dpr.rerank.config import RerankConfig
    from dpr.rerank.train import train_cross_encoder

    train = with_negatives(tiny_data_dir)
    cfg = RerankConfig(model=str(tiny_model_dir), max_length=64)
    cfg.train.max_steps, cfg.train.batch_size, cfg.train.negatives, cfg.train.save_every = 5, 3, 2, 0
    cfg.train.precision, cfg.train.lr = "fp32", 1e-3
    train_cross_encoder(cfg, train, tmp_path / "ahead", prefetch=2)
    train_cross_encoder(cfg, train, tmp_path / "inline", prefetch=0)
    assert _losses(tmp_path / "ahead") == _losses(tmp_path / "inline")
    enc = "cross_encoder/encoder/model.safetensors"
    assert _same(load_file(str(tmp_path / "ahead" / enc)), load_file(str(tmp_path / "inline" / enc)))


def test_reader_batches_are_the_same_built_ahead(tiny_model_dir, tiny_data_dir, tmp_path):
    from dpr.reader.config import ReaderConfig
    from dpr.reader.train import train_reader
    from dpr.trainkit.config_dict import plain

    train = with_negatives(tiny_data_dir)
    cfg = plain(ReaderConfig(model=str(tiny_model_dir), max_length=64))
    cfg["train"].update(batch_size=3, negatives=2, lr=1e-3, max_steps=5, save_every=0, precision="fp32")
    train_reader(cfg, train, tmp_path / "ahead", prefetch=2)  # 5 steps cross an epoch (3 steps of 8 questions)
    train_reader(cfg, train, tmp_path / "inline", prefetch=0)
    assert _losses(tmp_path / "ahead") == _losses(tmp_path / "inline")
    head = "reader/reader_head.safetensors"
    assert _same(load_file(str(tmp_path / "ahead" / head)), load_file(str(tmp_path / "inline" / head)))
