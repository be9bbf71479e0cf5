"""``dense.dims`` / ``dense.dim`` in dpr-pipeline (Matryoshka sizes): a ``dense@<d>`` system from the trained model's
vectors truncated to d, reported beside ``dense``, its stages skipped on a rerun; bad sizes one line each."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.system.test_pipeline import _pipeline

BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_pipeline_dense_dims_adds_truncated_system_and_skips_on_rerun(tiny_data_dir, tiny_model_dir, tmp_path):
    from dpr.index import read_index_meta
    from dpr.index.shards import read_embeddings
    from dpr.models.truncate import truncate

    out = tmp_path / "run"
    cosine = ("model.similarity=cosine", "model.temperature=0.05")  # the truncation re-normalises: checked below
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, "dense.dims=[16]", *cosine)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "eval" / "report.json").read_text())
    systems = list(report["systems"])
    assert systems.index("dense@16") == systems.index("dense") + 1  # beside dense
    # dense@16's vectors: dense's, truncated and re-normalised (float16 storage: |Δ| <= 2e-3)
    ids, full = read_embeddings(out / "dense" / "embeddings")
    ids16, cut = read_embeddings(out / "dense@16" / "embeddings")
    assert ids16 == ids and cut.shape == (len(ids), 16)
    want = truncate(torch.from_numpy(full), 16, True).numpy()
    assert np.abs(cut - want).max() <= 2e-3
    assert np.allclose(np.linalg.norm(cut, axis=1), 1.0, atol=2e-3)
    meta = read_index_meta(out / "dense@16" / "index.faiss")
    assert (meta["dim"], meta["truncate_dim"], meta["model_dim"]) == (16, 16, 32)
    # the hybrid fuses the full-size dense system
    weight = json.loads((out / "hybrid" / "weight.json").read_text())
    assert weight["grid"]
    first = json.loads((out / "timings.json").read_text())
    assert {"dense@16_truncate", "dense@16_index", "dense@16_retrieve_test", "dense@16_retrieve_dev"} <= \
        set(first["seconds"])
    assert "dense@16_encode" not in first["seconds"]  # no re-encode

    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, "dense.dims=[16]", *cosine, in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    skipped = set(json.loads((out / "timings.json").read_text())["skipped"])
    assert set(first["seconds"]) - {"prepare", "total"} <= skipped


@pytest.mark.parametrize("override, words", [
    ("dense.dims=[64]", ["dense.dims", "64", "32"]),
    ("dense.dims=[16,16]", ["dense.dims", "distinct"]),
    ("dense.dims=[0]", ["dense.dims"]),
    ("dense.dim=40", ["dense.dim", "40", "32"]),
    ("dense.dim=8", ["dense.dims", "dense.dim=8"]),
])
def test_pipeline_bad_dims_are_one_line_before_any_stage(tiny_data_dir, tiny_model_dir, tmp_path, override, words):
    extra = (override, "dense.dims=[16]") if override.startswith("dense.dim=") else (override,)
    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, *extra, in_process=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert all(w in lines[0] for w in words), lines[0]
    assert not (out / "stages").exists() or not any((out / "stages").iterdir())


def test_default_config_records_the_stage_params_it_recorded_before_dims():
    """With dense.dim and dense.dims at their defaults every stage records the parameters it recorded before they
    existed (so every recorded run's stages stay up to date), and the report holds the same systems:
    ``data/default_stage_params.json`` was written by ``data/record_stage_params.py`` on commit a7f7796."""
    import os
    import subprocess

    here = Path(__file__).parent / "data"
    env = {k: v for k, v in os.environ.items() if k != "DPR_DATA_MIRROR"}  # recorded as data.mirror_dir: null
    proc = subprocess.run([sys.executable, str(here / "record_stage_params.py")], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(here.parents[2]), "WANDB_MODE": "disabled"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == json.loads((here / "default_stage_params.json").read_text())


@pytest.mark.slow
def test_pipeline_dense_dim_encodes_both_dense_systems_at_that_size(tiny_data_dir, tiny_model_dir, tmp_path):
    """dense.dim=16: dense_untrained and dense hold 16-d vectors (the trained ones stored from training's own
    vectors, truncated: no second encode), and dense.dims below it truncate those further."""
    from dpr.index import read_index_meta
    from dpr.index.shards import list_shards

    out = tmp_path / "run"
    # encode.runtime=torch: training's vectors are torch's, and where `auto` picks ONNX Runtime (fp32 encoding on an
    # AVX-512 CPU: no native bf16, or DPR_NO_BF16) the corpus is encoded again instead of stored from training, so
    # the stored-and-truncated path would go untested there (test_pipeline.py checks auto's choice on each CPU)
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, "dense.dim=16", "dense.dims=[8]", "encode.runtime=torch",
                     in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for system, dim in (("dense_untrained", 16), ("dense", 16), ("dense@8", 8)):
        manifest = list_shards(out / system / "embeddings")[0].manifest
        assert (manifest["dim"], manifest["truncate_dim"], manifest["model_dim"]) == (dim, dim, 32), system
        assert read_index_meta(out / system / "index.faiss")["dim"] == dim
    assert list_shards(out / "dense" / "embeddings")[0].manifest.get("reused_from") == "training validation"
    report = json.loads((out / "eval" / "report.json").read_text())
    assert {"dense_untrained", "dense", "dense@8", "hybrid"} <= set(report["systems"])
