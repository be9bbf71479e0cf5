"""Hydra's submitit launcher drives the commands: a `dpr-train` sweep and a `dpr-encode` array, each point a
submitit job (``hydra/launcher=submitit_local`` here; ``submitit_slurm`` / ``dpr_slurm`` submit the same jobs to
Slurm), give what the same commands give run one by one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from dpr.index.shards import read_embeddings
from tests.run_command import run_command
from tests.training.test_trainer import _env, dpr_train, write_tiny_data_conf

TIMEOUT = 400


def console(name: str) -> list[str]:
    script = Path(sys.executable).parent / name
    return [str(script)] if script.is_file() else [sys.executable, "-m", f"dpr.cli.{name.split('-', 1)[1]}"]


def run(cmd: list[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
def test_train_sweep_through_submitit(tiny_model_dir, tiny_data_dir, tmp_path):
    """Two training jobs of a sweep, each a submitit job with its own log, each a whole run with its own lr
    (through dpr's preset dpr_local, which extends the plugin's submitit_local)."""
    conf = write_tiny_data_conf(tmp_path / "conf")
    sweep = tmp_path / "sweep"
    run([*dpr_train(), "-m", "--config-dir", str(conf), "data=tiny", f"data_dir={tiny_data_dir}", "model=tiny",
         f"model.name={tiny_model_dir}", f"output_dir={sweep}", "train.max_steps=2", "train.batch_size=4",
         "train.hard_negatives=1", "train.val_batch_size=8", "train.precision=fp32", "threads=1",
         "train.lr=1e-3,2e-3", "hydra/launcher=dpr_local"], tmp_path)
    summaries = sorted(sweep.glob("*/train_summary.json"))
    assert len(summaries) == 2, sorted(p.name for p in sweep.iterdir())
    lrs = sorted(float(o.split("=", 1)[1]) for s in summaries for o in json.loads(s.read_text())["overrides"]
                 if o.startswith("train.lr="))
    assert lrs == [1e-3, 2e-3]
    for s in summaries:
        assert json.loads(s.read_text())["steps"] == 2 and (s.parent / "question_encoder").is_dir()
        assert "done:" in (s.parent / "train.log").read_text()  # each job's log where Hydra's launcher put it
    logs = list((sweep / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 2  # each job ran as its own submitit process
    assert (sweep / "sweep_summary.md").is_file()  # the sweep's callback saw both jobs


def test_slurm_preset_composes(tmp_path):
    """hydra/launcher=dpr_slurm is the plugin's Slurm launcher with dpr's settings (no Slurm needed to compose)."""
    proc = subprocess.run([*dpr_train(), "hydra/launcher=dpr_slurm", "hydra.launcher.partition=gpu", "--cfg", "hydra",
                           "-p", "hydra.launcher"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    launcher = yaml.safe_load(proc.stdout)
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    assert (launcher["gpus_per_node"], launcher["tasks_per_node"], launcher["partition"]) == (1, 1, "gpu")
    assert launcher["timeout_min"] == 1440 and "export TOKENIZERS_PARALLELISM=false" in launcher["setup"]


@pytest.mark.slow
def test_encode_and_index_arrays(tiny_model_dir, tiny_data_dir, tmp_path):
    """``dpr-encode -m shard_id=0,1 num_shards=2`` as two submitit jobs: their shards, read together, are the
    one-process encode's vectors and ids; then ``dpr-index -m index=flat,hnsw`` builds both indexes as two jobs."""
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    common = [f"model={tiny_model_dir}", f"passages={passages}", "dtype=float32", "autocast=off", "threads=1",
              "batch_size=4"]
    # the reference: the one-process encode, run in this process
    one_process = run_command(["dpr-encode", *common, f"output_dir={tmp_path / 'one'}"], cwd=tmp_path, env=_env())
    assert one_process.returncode == 0, one_process.stderr[-3000:]
    run([*console("dpr-encode"), "-m", *common, f"output_dir={tmp_path / 'array'}", "num_shards=2", "shard_id=0,1",
         "hydra/launcher=submitit_local", f"hydra.sweep.dir={tmp_path / 'jobs'}"], tmp_path)
    assert len(list((tmp_path / "jobs" / ".submitit").glob("*/*_log.out"))) == 2
    assert sorted(p.name for p in (tmp_path / "array").glob("shard_*.npy")) == [
        "shard_000_of_002.npy", "shard_001_of_002.npy"]
    one_ids, one = read_embeddings(tmp_path / "one")
    ids, vectors = read_embeddings(tmp_path / "array")
    assert ids == one_ids and len(ids) > 2
    np.testing.assert_allclose(vectors, one, rtol=0, atol=1e-5)  # batches differ: fp32 padding noise only
    # an index array over those shards: one job per index type, each its own file
    run([*console("dpr-index"), "-m", f"embeddings={tmp_path / 'array'}", "index=flat,hnsw", "threads=1",
         f"output={tmp_path / 'idx'}/${{hydra:runtime.choices.index}}.faiss", "hydra/launcher=submitit_local",
         f"hydra.sweep.dir={tmp_path / 'index_jobs'}"], tmp_path)
    for name in ("flat", "hnsw"):
        assert (tmp_path / "idx" / f"{name}.faiss.ids").read_text().split() == ids
