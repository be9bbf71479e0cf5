"""scripts/bench_scale.py end to end at a tiny size: the tiny random model encodes the tiny corpus, which is
hidden among synthetic passages and vectors; the JSON holds every cost, growth law and projection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from scale_stats import growth_exponent, project  # noqa: E402
from scale_synth import PassageSampler, gaussian_like  # noqa: E402


def test_growth_law_and_projection():
    sizes = [1e4, 1e5, 1e6]
    assert growth_exponent(sizes, [2.0, 20.0, 200.0]) == pytest_approx(1.0)
    assert growth_exponent(sizes, [1.0, 10 ** 0.5, 10.0]) == pytest_approx(0.5)
    assert growth_exponent([1e4], [1.0]) is None
    assert project(sizes, [2.0, 20.0, 200.0], 2.1e7)["at_target"] == pytest_approx(4200.0)


def pytest_approx(x):
    import pytest

    return pytest.approx(x, rel=1e-6)


def test_synthetic_data_follows_the_real_statistics():
    texts = ["the cat sat on the mat", "a dog and the cat", "the end"]
    sampler = PassageSampler(texts, ["T"], seed=1)
    out, titles = sampler.sample(200)
    assert {len(t.split()) for t in out} <= {2, 5, 6} and set(titles) == {"T"}
    assert {w for t in out for w in t.split()} <= {w for t in texts for w in t.split()}
    rng = np.random.default_rng(0)
    real = rng.standard_normal((50, 8)) + 3.0
    real /= np.linalg.norm(real, axis=1, keepdims=True)
    fake = gaussian_like(real, 5000, seed=0)
    assert fake.dtype == np.float32 and np.allclose(np.linalg.norm(fake, axis=1), 1.0, atol=1e-5)
    assert np.abs(fake.mean(0) - real.mean(0)).max() < 0.05


def test_bench_scale_end_to_end(tiny_model_dir, tiny_data_dir, tmp_path):
    out = tmp_path / "scale.json"
    env = dict(os.environ, WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO))
    cmd = [sys.executable, str(REPO / "scripts" / "bench_scale.py"), "--sizes", "500,1000", "--json", str(out),
           "--data-dir", str(tiny_data_dir), "--dataset", "tiny", "--model", str(tiny_model_dir),
           "--candidates", "IVF{nlist},PQ{m};IVF8,PQ4;IVF4096,PQ4", "--nprobes", "1,4",
           "--question-vectors", str(tmp_path / "q.npy")]
    np.save(tmp_path / "q.npy", np.zeros((8, 32), dtype=np.float32))  # a stale cache of the right size, no sidecar
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert np.abs(np.load(tmp_path / "q.npy")).sum() > 0  # not reused: re-encoded with this model
    from dpr.index.fingerprint import model_fingerprint
    assert json.loads((tmp_path / "q.npy.json").read_text())["model"] == model_fingerprint(tiny_model_dir)
    assert set(res) >= {"config", "sizes", "sweep", "growth", "projection", "recommendation"}
    assert res["config"]["sizes"] == [500, 1000] and res["config"]["real_passages"] == 8
    for n in ("500", "1000"):
        assert set(res["sizes"][n]) == {"bm25", "flat", "hnsw", "ivfpq"}
        for system in res["sizes"][n].values():
            assert {"build_s", "peak_mem_bytes", "index_bytes", "bytes_per_passage", "qps", "top20"} <= set(system)
            assert 0.0 <= system["top20"] <= 1.0
    assert res["sizes"]["1000"]["flat"]["bytes_per_passage"] >= 4 * 32  # 32-dim float32 vectors
    for system in ("bm25", "flat", "hnsw", "ivfpq"):
        assert {"build_s", "peak_mem_bytes", "index_bytes", "ms_per_query"} == set(res["growth"][system])
        assert {"memory_gb", "build_hours", "ms_per_query"} <= set(res["projection"][system])
    swept = [c for c in res["sweep"] if "skipped" not in c]
    assert len(swept) == 4 and {c["nprobe"] for c in swept} == {1, 4}  # 2 factories x 2 nprobes
    assert any("IVF4096" in c["factory"] and "skipped" in c for c in res["sweep"])  # too few vectors: recorded
    assert all("loss_points" in c and "fits" in c for c in swept)
    assert "recommended:" in proc.stdout and "growth law" in proc.stdout
    assert res["complete"] is True and np.load(tmp_path / "q.npy").shape == (8, 32)  # cached for reruns
