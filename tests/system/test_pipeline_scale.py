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
