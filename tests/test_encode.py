"""Sharded passage encoding: shard bookkeeping, exactness against a direct forward pass, resume."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch

from dpr.cli.encode import rename_overrides
from dpr.encode import assigned_shards, encode_corpus
from dpr.encode_config import EncodeConfig
from dpr.errors import DataError
from dpr.index.shards import ShardFiles, list_shards, shard_range, shards_for_rank

from tests.conftest import TINY_PASSAGES


@pytest.mark.parametrize("total", [0, 1, 5, 8, 100, 1001])
@pytest.mark.parametrize("num_shards", [1, 2, 3, 7, 8, 16, 200])
def test_shard_ranges_cover_every_passage_once(total, num_shards):
    ranges = [shard_range(total, i, num_shards) for i in range(num_shards)]
    covered = [p for lo, hi in ranges for p in range(lo, hi)]
    assert covered == list(range(total))  # contiguous, in order, each passage exactly once
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1
    # torchrun: the ranks' shard lists partition the shards
    for world in (1, 2, 3, 5):
        per_rank = [shards_for_rank(num_shards, r, world) for r in range(world)]
        assert sorted(s for ss in per_rank for s in ss) == list(range(num_shards))


def test_shard_assignment():
    assert assigned_shards(4, shard_id=2) == [2]
    assert assigned_shards(4, rank=0, world_size=1) == [0, 1, 2, 3]
    assert assigned_shards(5, rank=1, world_size=2) == [1, 3]
    assert assigned_shards(2, rank=3, world_size=4) == []
    assert assigned_shards(4, shard_id=2, rank=1, world_size=2) == []  # an explicit shard is rank 0's
    with pytest.raises(ValueError):
        assigned_shards(4, shard_id=4)
    with pytest.raises(ValueError):
        shard_range(10, 0, 0)
    assert rename_overrides(["model=/x/y=z", "passages=p", "+model_path=q"], {"model": "model_path"}) == [
        "model_path=/x/y=z", "passages=p", "+model_path=q"]


def read_all(out):
    shards = list_shards(out)
    vecs = np.concatenate([np.asarray(s.vectors()) for s in shards])
    ids = [pid for s in shards for pid in s.ids()]
    return vecs, ids, shards


def direct_cls_vectors(model_dir):
    """What the passage tower must produce for an HF BERT: the [CLS] state of (title, text), one at a time."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    bert = AutoModel.from_pretrained(model_dir).eval()
    rows = []
    with torch.no_grad():
        for _, text, title in TINY_PASSAGES:
            enc = tok(title, text, truncation=True, max_length=256, return_tensors="pt")
            rows.append(bert(**enc).last_hidden_state[0, 0].numpy())
    return np.stack(rows)


def test_vectors_equal_direct_forward_pass(tiny_model_dir, tiny_data_dir, tmp_path):
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    expected = direct_cls_vectors(tiny_model_dir)
    kw = dict(num_shards=3, cache_dir=tmp_path / "arrow", progress=False)
    settings = dict(batch_size=2, chunk_size=2, autocast="off")
    out32 = encode_corpus(tiny_model_dir, passages, tmp_path / "f32", EncodeConfig(dtype="float32", **settings), **kw)
    vecs, ids, shards = read_all(out32)
    assert ids == [pid for pid, _, _ in TINY_PASSAGES]
    assert vecs.dtype == np.float32 and [s.count for s in shards] == [2, 3, 3]
    np.testing.assert_allclose(vecs, expected, rtol=0, atol=1e-5)
    assert shards[0].manifest["dim"] == 32 and shards[0].manifest["normalized"] is False

    out16 = encode_corpus(tiny_model_dir, passages, tmp_path / "f16", EncodeConfig(dtype="float16", **settings), **kw)
    vecs16, ids16, _ = read_all(out16)
    assert vecs16.dtype == np.float16 and ids16 == ids
    np.testing.assert_allclose(vecs16.astype(np.float32), expected, rtol=1e-3, atol=1e-3)


class Killed(RuntimeError):
    pass


def test_resume_after_killed_shard(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch, caplog):
    import dpr.models

    passages = tiny_data_dir / "tiny" / "passages.tsv"
    config = EncodeConfig(batch_size=2, chunk_size=3, dtype="float32", autocast="off")
    kw = dict(num_shards=2, cache_dir=tmp_path / "arrow", progress=False)
    reference, ref_ids, _ = read_all(encode_corpus(tiny_model_dir, passages, tmp_path / "ref", config, **kw))

    real = dpr.models.iter_encode_batches
    calls = {"n": 0}

    def dies_after_first_batch(*args, **kwargs):
        for item in real(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] > 1:
                raise Killed("simulated kill")
            yield item

    out = tmp_path / "emb"
    monkeypatch.setattr(dpr.models, "iter_encode_batches", dies_after_first_batch)
    with pytest.raises(Killed):
        encode_corpus(tiny_model_dir, passages, out, config, **kw)
    monkeypatch.setattr(dpr.models, "iter_encode_batches", real)
    # the killed shard left only temp files: nothing that looks finished
    visible = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert visible == []
    assert any(p.name.endswith(".tmp") for p in out.iterdir())
    with pytest.raises(DataError):
        list_shards(out)

    # a stale half-written temp file of shard 1 from an even older run is discarded too
    (out / ".shard_001_of_002.npy.tmp").write_bytes(b"garbage")
    with caplog.at_level(logging.INFO, logger="dpr.encode"):
        encode_corpus(tiny_model_dir, passages, out, config, **kw)
    vecs, ids, _ = read_all(out)
    assert ids == ref_ids and len(set(ids)) == len(ids) == len(TINY_PASSAGES)
    np.testing.assert_array_equal(vecs, reference)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    assert "skipped" not in caplog.text

    # finished shards are skipped: the model is not even loaded, files are untouched
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    caplog.clear()

    def no_model(*a, **k):
        raise AssertionError("the model must not be loaded when every shard is finished")

    monkeypatch.setattr(dpr.models, "load_biencoder", no_model)
    with caplog.at_level(logging.INFO, logger="dpr.encode"):
        encode_corpus(tiny_model_dir, passages, out, config, **kw)
    assert caplog.text.count("already encoded (") == 2 and "all 2 assigned shard(s) already encoded" in caplog.text
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes

    # a manifest from different settings (here dtype) does not count as finished
    monkeypatch.undo()
    encode_corpus(tiny_model_dir, passages, out, dataclasses.replace(config, dtype="float16"), shard_id=1, **kw)
    assert ShardFiles.of(out, 1, 2).manifest.stat().st_mtime_ns != mtimes["shard_001_of_002.json"]
    with pytest.raises(DataError, match="dtype"):
        list_shards(out)  # shard 0 float32, shard 1 float16: refused rather than mixed silently


def test_torchrun_rank_encodes_its_shards(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = encode_corpus(tiny_model_dir, tiny_data_dir / "tiny" / "passages.tsv", tmp_path / "emb",
                        EncodeConfig(dtype="float32", autocast="off"), num_shards=4, cache_dir=tmp_path / "arrow",
                        progress=False)
    names = sorted(p.name for p in out.glob("*.json"))
    assert names == ["shard_001_of_004.json", "shard_003_of_004.json"]


def test_more_shards_than_passages_and_bad_dtype(tiny_model_dir, tiny_data_dir, tmp_path):
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    fp32 = EncodeConfig(dtype="float32", autocast="off")
    out = encode_corpus(tiny_model_dir, passages, tmp_path / "emb", fp32, num_shards=10, cache_dir=tmp_path / "arrow",
                        progress=False)
    vecs, ids, shards = read_all(out)
    assert len(shards) == 10 and sum(s.count == 0 for s in shards) == 2
    assert ids == [pid for pid, _, _ in TINY_PASSAGES] and vecs.shape == (8, 32)
    # re-encoding the same directory with another num_shards replaces the old shards, never mixes them
    encode_corpus(tiny_model_dir, passages, out, fp32, num_shards=3, cache_dir=tmp_path / "arrow", progress=False)
    assert len(list(out.glob("*.npy"))) == 3
    vecs3, ids3, _ = read_all(out)
    # other shard sizes batch (and pad) passages differently: equal up to float rounding
    assert ids3 == ids and np.allclose(vecs3, vecs, atol=1e-5)
    with pytest.raises(ValueError, match="dtype"):
        encode_corpus(tiny_model_dir, passages, tmp_path / "x", EncodeConfig(dtype="int8"))
