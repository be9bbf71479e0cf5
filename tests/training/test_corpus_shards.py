"""Under two gloo processes a sampled corpus is encoded in shares (each rank its rows, gathered in row order: the
one-process vectors) and a run with frozen-index steps on a sample trains from a streamed training file."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.corpus_shard_worker import TEXTS

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_each_rank_encodes_its_share_of_the_sample(tiny_model_dir, tiny_data_dir, tmp_path):
    from dpr.models import load_biencoder
    from dpr.training.corpus_negatives import CorpusNegatives

    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(HERE / "corpus_shard_worker.py"),
           "--model-dir", str(tiny_model_dir), "--data-dir", str(tiny_data_dir), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["encoded"] for r in ranks] == [[6], [5]]  # 11 passages: rows 0, 2, .. and rows 1, 3, ..
    model, tok = load_biencoder(str(tiny_model_dir), pooling="mean", passage_max_length=32)
    alone = CorpusNegatives([f"d{i}" for i in range(11)], TEXTS, [""] * 11, positions=list(range(11)))
    alone.refresh(model, tok, step=0, batch_size=4, max_length=32, autocast="off")
    for r in ranks:
        assert torch.allclose(torch.tensor(r["vectors"]), alone.vectors, atol=1e-5)
        assert r["steps"] == 3 and r["world"] == 2
