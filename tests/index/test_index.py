"""FAISS index over embedding shards: exactness of flat search, save/load round trips, shard checks, CLI."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpr.errors import DataError
from dpr.index import build_and_save, build_index, default_nlist, default_pq_m, load_index, resolve_factory, save_index, search
from dpr.index.shards import ShardFiles, list_shards, shard_range, write_shard
from tests.run_command import run_as_subprocess

N, DIM = 1200, 32
BIN = Path(sys.executable).parent


def make_vectors(n=N, dim=DIM, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write_embeddings(root: Path, x: np.ndarray, num_shards=3, dtype=np.float32) -> list[str]:
    ids = [f"doc{i}" for i in range(len(x))]
    for s in range(num_shards):
        lo, hi = shard_range(len(x), s, num_shards)
        write_shard(root, s, num_shards, x[lo:hi].astype(dtype), ids[lo:hi], model="random", normalized=True)
    return ids


@pytest.fixture(scope="module")
def emb(tmp_path_factory):
    root = tmp_path_factory.mktemp("emb")
    x = make_vectors()
    ids = write_embeddings(root, x)
    return root, x, ids


@pytest.fixture(scope="module")
def queries():
    return make_vectors(25, seed=1)


def test_flat_search_equals_bruteforce(emb, queries):
    root, x, ids = emb
    index, got_ids = build_index(root, add_batch_size=100)  # several add batches across shard borders
    assert got_ids == ids and index.ntotal == N
    hits, scores = search(index, got_ids, queries, k=10, batch_size=7)
    sims = queries @ x.T
    top = np.argsort(-sims, axis=1)[:, :10]
    assert hits == [[ids[j] for j in row] for row in top]
    np.testing.assert_allclose(scores, np.take_along_axis(sims, top, axis=1), rtol=1e-5, atol=1e-5)


INDEXES = {
    "flat": dict(factory="Flat"),
    "hnsw": dict(factory="HNSW16", ef_construction=40, ef_search=32),
    "ivfpq": dict(factory="IVF{nlist},PQ{m}", train_sample=800, nprobe=4),
}


@pytest.mark.parametrize("kind", sorted(INDEXES))
def test_save_load_returns_identical_results(emb, queries, tmp_path, kind):
    root, _, ids = emb
    params = INDEXES[kind]
    index, got_ids = build_index(root, **params)
    before = search(index, got_ids, queries, k=10)
    path = tmp_path / f"{kind}.faiss"
    save_index(index, got_ids, path)
    loaded, loaded_ids = load_index(path, nprobe=params.get("nprobe"), ef_search=params.get("ef_search"))
    assert loaded_ids == ids
    after = search(loaded, loaded_ids, queries, k=10)
    assert after[0] == before[0]
    np.testing.assert_array_equal(after[1], before[1])
    # memory-mapped loading gives the same answers for flat and IVF indexes (faiss cannot mmap HNSW)
    if kind != "hnsw":
        mm, mm_ids = load_index(path, nprobe=params.get("nprobe"), mmap=True)
        assert search(mm, mm_ids, queries, k=10)[0] == before[0]


def test_ivfpq_is_deterministic_and_compressed(emb, queries, tmp_path):
    root, _, _ = emb
    metas, hits = [], []
    for i in range(2):
        out = tmp_path / f"ivfpq{i}.faiss"
        metas.append(build_and_save(root, out, **INDEXES["ivfpq"]))
        index, ids = load_index(out, nprobe=4)
        hits.append(search(index, ids, queries, k=10))
    assert hits[0][0] == hits[1][0]
    np.testing.assert_array_equal(hits[0][1], hits[1][1])
    # 800 training vectors → nlist capped to 800 // 39 = 20; m = 32 / 8 = 4 → 4-byte codes + 8-byte ids
    assert metas[0]["factory"] == "IVF20,PQ4"
    flat = build_and_save(root, tmp_path / "flat.faiss")
    assert flat["factory"] == "Flat" and flat["count"] == N and flat["dim"] == DIM
    assert 4 * DIM <= flat["bytes_per_passage"] < 4 * DIM + 1
    # per passage: 4 code bytes + 8 id bytes; shared: PQ codebooks (4 × 256 × 8 floats) + 20 centroids
    assert metas[0]["bytes_per_passage"] == pytest.approx(4 + 8 + (4 * 256 * 8 + 20 * DIM) * 4 / N, abs=1)
    meta = json.loads(Path(str(tmp_path / "flat.faiss") + ".json").read_text())
    assert meta["model"] == "random" and meta["normalized"] is True


def test_l2_metric_scores_higher_is_better(emb, queries):
    root, x, ids = emb
    index, got_ids = build_index(root, metric="l2")
    hits, scores = search(index, got_ids, queries, k=5)
    d2 = ((queries[:, None, :] - x[None]) ** 2).sum(-1)
    top = np.argsort(d2, axis=1)[:, :5]
    assert hits == [[ids[j] for j in row] for row in top]
    np.testing.assert_allclose(scores, -np.take_along_axis(d2, top, axis=1), rtol=1e-4, atol=1e-4)
    assert (np.diff(scores, axis=1) <= 0).all()


def test_k_larger_than_corpus_and_float16_shards(tmp_path):
    x = make_vectors(5)
    ids = write_embeddings(tmp_path, x, num_shards=7, dtype=np.float16)  # 7 shards, two of them empty
    index, got_ids = build_index(tmp_path)
    assert got_ids == ids
    hits, scores = search(index, got_ids, x[:2], k=100)
    assert scores.shape == (2, 5) and len(hits[0]) == 5 and hits[0][0] == "doc0" and hits[1][0] == "doc1"
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=2e-3)  # float16 storage: ~1e-3 relative


def test_missing_or_broken_shards_are_refused(tmp_path):
    x = make_vectors(30)
    write_embeddings(tmp_path, x, num_shards=3)
    ShardFiles.of(tmp_path, 1, 3).manifest.unlink()
    with pytest.raises(DataError, match=r"missing or unfinished: \[1\]"):
        build_index(tmp_path)
    write_shard(tmp_path, 1, 3, x[10:20], [f"doc{i}" for i in range(10, 20)], model="random", normalized=True)
    assert len(list_shards(tmp_path)) == 3
    # ids file cut short after the manifest was written: the shard no longer vouches for itself
    ids_file = ShardFiles.of(tmp_path, 2, 3).ids
    ids_file.write_text("\n".join(f"doc{i}" for i in range(20, 25)) + "\n")
    with pytest.raises(DataError, match="disagree with the manifest"):
        build_index(tmp_path)
    other = tmp_path / "mixed"
    write_embeddings(other, x, num_shards=2)
    write_shard(other, 0, 3, x[:10], [f"doc{i}" for i in range(10)], model="random", normalized=True)
    with pytest.raises(DataError, match="different num_shards"):
        list_shards(other)
    with pytest.raises(FileNotFoundError):
        build_index(tmp_path / "nowhere")


def test_factory_placeholders_and_checks():
    assert default_pq_m(384) == 48 and default_pq_m(768) == 96 and default_pq_m(32) == 4
    assert default_nlist(1_000_000) == 4000
    assert default_nlist(1000) == 1000 // 39  # capped by training points per centroid
    assert resolve_factory("IVF{nlist},PQ{m}", 384, 1_000_000, 262_144) == "IVF4000,PQ48"
    assert resolve_factory("IVF{nlist},PQ{m}", 384, 10_000, nlist=50, m=96) == "IVF50,PQ96"
    with pytest.raises(ValueError, match="must divide"):
        resolve_factory("IVF16,PQ{m}", 384, 10_000, m=50)
    with pytest.raises(ValueError, match="at least 256"):
        resolve_factory("IVF4,PQ8", 32, 100)
    assert resolve_factory("IVF4,PQ8x4", 32, 100) == "IVF4,PQ8x4"
    with pytest.raises(ValueError, match="IVF lists"):
        resolve_factory("IVF200,Flat", 32, 100)


def test_gpu_request_without_gpu_falls_back(emb, queries, caplog, tmp_path):
    import faiss

    if faiss.get_num_gpus() > 0:
        pytest.skip("a GPU is visible: the fallback path does not apply")
    root, _, _ = emb
    with caplog.at_level(logging.WARNING):
        index, ids = build_index(root, device="gpu", **INDEXES["ivfpq"])
    assert "staying on CPU" in caplog.text
    assert index.ntotal == N and search(index, ids, queries, k=3)[0][0]
    caplog.clear()
    flat, ids = build_index(root)
    save_index(flat, ids, tmp_path / "flat.faiss")
    with caplog.at_level(logging.WARNING):
        loaded, _ = load_index(tmp_path / "flat.faiss", device="gpu")
    assert "staying on CPU" in caplog.text and loaded.ntotal == N


def test_cli_builds_ivfpq_and_reports_bad_input(emb, tmp_path):
    root, _, _ = emb
    out = tmp_path / "idx" / "ivfpq.faiss"
    proc = run_as_subprocess(
        [str(BIN / "dpr-index"), f"embeddings={root}", f"output={out}", "index=ivfpq", "index.train_sample=600"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "bytes/passage" in proc.stdout and "IVF15,PQ4" in proc.stdout
    assert out.is_file() and Path(str(out) + ".ids").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # nothing written into the cwd
    bad = run_as_subprocess(
        [str(BIN / "dpr-index"), f"embeddings={tmp_path / 'none'}", f"output={out}"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "dpr-index: error:" in bad.stderr


def test_a_manifest_nested_too_deeply_is_no_finished_shard(tmp_path):
    """The JSON decoder's RecursionError on a corrupt manifest means "not finished" (redone on resume), never a crash;
    so does valid JSON that is no object."""
    import numpy as np

    from dpr.index.shards import ShardFiles, check_shard, write_shard

    write_shard(tmp_path, 0, 1, np.ones((3, 4), dtype=np.float32), ["a", "b", "c"], start=0, end=3, total=3)
    files = ShardFiles.of(tmp_path, 0, 1)
    assert check_shard(files) is not None
    for bad in ("[" * 100_000 + "]" * 100_000, "[1, 2]", '"text"'):
        files.manifest.write_text(bad)
        assert check_shard(files) is None
