"""The pipeline at scale: its corpus encodes use every rank of a torchrun launch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from dpr.encode_config import EncodeConfig
from dpr.index.shards import read_embeddings
from dpr.pipeline_encode import encode_on_every_rank

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_encode_uses_every_rank(tiny_model_dir, tiny_data_dir, tmp_path):
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false",
               HF_DATASETS_CACHE=str(tmp_path / "arrow"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(HERE / "encode_rank_worker.py"),
           "--model", str(tiny_model_dir), "--passages", str(passages), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["encoded"] == [[0, 2]] and ranks[1]["encoded"] == [[1, 2]]  # each rank its own shard
    for r in ranks:  # and each returned with the whole corpus finished
        assert r["finished"] == ["shard_000_of_002.json", "shard_001_of_002.json"]
    ids, vecs = read_embeddings(tmp_path / "embeddings")
    one_ids, one = read_embeddings(encode_on_every_rank(
        tiny_model_dir, passages, tmp_path / "one", EncodeConfig(dtype="float32", autocast="off", runtime="torch")))
    assert ids == one_ids
    np.testing.assert_allclose(vecs, one, rtol=1e-4, atol=1e-5)


def test_current_complete_encode_keeps_its_layout(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """Under torchrun, a finished current one-shard encode (the trainer's export) is reused, not redone."""
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    cfg = EncodeConfig(dtype="float32", autocast="off", runtime="torch")
    out = encode_on_every_rank(tiny_model_dir, passages, tmp_path / "emb", cfg)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    encode_on_every_rank(tiny_model_dir, passages, out, cfg, poll_s=0.01)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_scale_rules():
    import pytest

    from dpr.pipeline_scale import ScaleConfig

    auto = ScaleConfig(untrained_max_passages=100)
    assert auto.keeps_untrained(100) and not auto.keeps_untrained(101)
    assert ScaleConfig(untrained=True, untrained_max_passages=1).keeps_untrained(10**9)
    assert not ScaleConfig(untrained=False).keeps_untrained(1)
    assert ScaleConfig().keeps_untrained(3_633)  # every dataset recorded so far keeps its baseline
    assert ScaleConfig(index_device="gpu").search_device() == "gpu"
    for bad in ({"untrained": "yes"}, {"untrained": 1}, {"index_device": "tpu"}, {"large_index_above": 0}):
        with pytest.raises(ValueError, match="scale."):
            ScaleConfig(**bad).check()


def test_large_corpus_gets_the_compact_index_small_keeps_its_section(tmp_path):
    import faiss

    from dpr.index import build_and_save, load_index
    from dpr.index.shards import write_shard
    from dpr.pipeline_scale import ScaleConfig, index_params

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    write_shard(tmp_path / "emb", 0, 1, x.astype(np.float16), [f"p{i}" for i in range(3000)], start=0, end=3000,
                total=3000, model="m", model_fingerprint="sha256:m", passages_sha256="sha256:p")
    flat = {"factory": "Flat", "metric": "ip", "device": "cpu", "add_batch_size": 65536}
    cpu = dict(index_device="cpu")
    assert index_params(flat, ScaleConfig(large_index_above=3000, **cpu), tmp_path / "emb") is flat  # unchanged
    hnsw = {"factory": "HNSW32", "metric": "ip"}
    assert index_params(hnsw, ScaleConfig(large_index_above=10, **cpu), tmp_path / "emb") is hnsw  # a choice kept
    assert index_params(flat, ScaleConfig(large_index_above=10, index_device="gpu"), tmp_path / "emb") is flat
    big = index_params(flat, ScaleConfig(large_index_above=2999, **cpu), tmp_path / "emb")
    assert big["factory"] == "IVF{nlist},PQ{m}" and big["m"] == 8 and big["nprobe"] == big["nlist"] == 76
    meta = build_and_save(tmp_path / "emb", tmp_path / "ivf.faiss", **big)
    assert meta["factory"] == "IVF76,PQ8" and meta["bytes_per_passage"] < 0.25 * 4 * 32
    index, _ = load_index(tmp_path / "ivf.faiss")
    assert faiss.extract_index_ivf(index).nprobe == 76  # every list probed


def test_pipeline_without_the_untrained_baseline(tiny_data_dir, tiny_model_dir, tmp_path):
    from tests.system.test_pipeline import _pipeline

    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, "scale.untrained_max_passages=7", in_process=True)  # 8: off
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "eval" / "report.json").read_text())
    assert {"bm25", "dense", "hybrid"} <= set(report["systems"]) and "dense_untrained" not in report["systems"]
    assert not list((out / "stages").glob("*untrained*")) and not (out / "dense_untrained").exists()
    assert "no untrained-model baseline for 8 passages" in proc.stdout + proc.stderr


def test_pipeline_under_torchrun_encodes_on_both_ranks(tiny_data_dir, tiny_model_dir, tmp_path):
    """`dpr-pipeline` under a 2-process torchrun (gloo): training is data-parallel, the untrained model's corpus
    encode is one shard per rank, the trained model's export (one shard, from training) is reused by both."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(Path(sys.executable).parent / "dpr-pipeline"),
           "data.name=tiny", "data.kind=qa", "data.recipe=none", f"data_dir={tiny_data_dir}", f"output_dir={out}",
           f"model.name={tiny_model_dir}", "model.shared=false", "model.pooling=cls", "model.similarity=dot",
           "train.max_steps=4", "train.batch_size=4", "train.hard_negatives=1", "train.save_every=0",
           "train.val_max_questions=4", "train.frozen_steps=2", "bm25.num_negatives=3", "retrieve.k=5",
           "encode.batch_size=4"]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    for rank in (0, 1):
        assert f"shard {rank}/2: 4 passages" in log  # each rank encoded its half of the 8 passages
    assert sorted(p.name for p in (out / "dense_untrained" / "embeddings").glob("*.json")) == [
        "shard_000_of_002.json", "shard_001_of_002.json"]
    assert [p.name for p in (out / "dense" / "embeddings").glob("*.json")] == ["shard_000_of_001.json"]
    report = json.loads((out / "eval" / "report.json").read_text())
    assert {"bm25", "dense_untrained", "dense", "hybrid"} <= set(report["systems"])
