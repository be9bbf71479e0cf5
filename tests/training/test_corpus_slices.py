"""A sampled corpus held in slices across ranks (dpr/training/corpus_slices.py): the per-question top-k merge, and under
two gloo processes the same candidates, loss, gradients and training numbers as with every vector on every rank, each
rank keeping n / world rows."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpr.training.corpus_slices import merge_topk, search_slice, slice_rows

HERE = Path(__file__).resolve().parent


def _reference(scores: np.ndarray, k: int) -> np.ndarray:
    """Each question's k best rows of the whole set: score descending, ties by the smaller row."""
    return np.array([sorted(range(scores.shape[1]), key=lambda r: (-scores[i, r], r))[:k]
                     for i in range(scores.shape[0])], dtype=np.int64).reshape(scores.shape[0], k)


def _slice_tops(scores: np.ndarray, world: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each slice's top-k (ties kept in any order, as an index may), side by side and shuffled, padded with -1."""
    q, n = scores.shape
    out_s, out_r = np.full((q, world * k), -np.inf), np.full((q, world * k), -1, dtype=np.int64)
    for r in range(world):
        rows = np.array(slice_rows(n, r, world), dtype=np.int64)
        for i in range(q):
            best = sorted(rows.tolist(), key=lambda j: (-scores[i, j], j))[:k]
            best = rng.permutation(np.array(best, dtype=np.int64)) if best else np.zeros(0, dtype=np.int64)
            out_s[i, r * k:r * k + len(best)], out_r[i, r * k:r * k + len(best)] = scores[i, best], best
    perm = rng.permutation(world * k)
    return out_s[:, perm], out_r[:, perm]


@settings(max_examples=150, deadline=None)
@given(q=st.integers(0, 4), n=st.integers(1, 30), world=st.integers(1, 5), k=st.integers(1, 8),
       levels=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_merged_slice_tops_are_the_whole_sets_top_k_ties_by_row(q, n, world, k, levels, seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, levels, size=(q, n)).astype(np.float32)  # few levels: many ties
    k = min(k, n)
    tops_s, tops_r = _slice_tops(scores, world, k, rng)
    merged = merge_topk(tops_s, tops_r, k)
    assert merged.shape == (q, k)
    np.testing.assert_array_equal(merged, _reference(scores, k))


def test_merge_pads_with_no_row_when_fewer_candidates_than_k():
    merged = merge_topk(np.array([[0.5, -np.inf, 0.5]]), np.array([[4, -1, 2]]), 4)
    assert merged.tolist() == [[2, 4, -1, -1]]


def test_slices_searched_with_faiss_and_merged_match_one_index():
    import faiss

    rng = np.random.default_rng(3)
    n, d, k, world = 101, 16, 9, 3
    vectors = rng.standard_normal((n, d)).astype(np.float32)
    q = rng.standard_normal((25, d)).astype(np.float32)
    one = faiss.IndexFlatIP(d)
    one.add(vectors)
    _, expect = one.search(q, k)
    parts = []
    for r in range(world):
        index = faiss.IndexFlatIP(d)
        index.add(vectors[r::world])
        parts.append(search_slice(index, q, k, r, world))
    both = np.concatenate(parts, axis=1)
    merged = merge_topk(both[..., 0], both[..., 1].astype(np.int64), k)
    np.testing.assert_array_equal(merged, expect)  # continuous scores: no ties, the same order


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), world=st.integers(1, 4), k=st.integers(1, 10), nq=st.sampled_from([1, 3, 24]),
       seed=st.integers(0, 2**31 - 1))
def test_slices_keep_the_whole_sets_top_k_scores_under_ties(n, world, k, nq, seed):
    import faiss

    rng = np.random.default_rng(seed)
    vectors = rng.integers(-1, 2, size=(n, 3)).astype(np.float32)  # small integers: exact scores, many ties
    q = rng.integers(-1, 2, size=(nq, 3)).astype(np.float32)
    k = min(k, n)
    parts = []
    for r in range(world):
        index = faiss.IndexFlatIP(3)
        index.add(vectors[r::world])
        parts.append(search_slice(index, q, k, r, world))
    both = np.concatenate(parts, axis=1)
    merged = merge_topk(both[..., 0], both[..., 1].astype(np.int64), k)
    exact = q @ vectors.T
    assert (merged >= 0).all() and all(len(set(row)) == k for row in merged.tolist())
    np.testing.assert_array_equal(np.take_along_axis(exact, merged, axis=1), -np.sort(-exact, axis=1)[:, :k])


def test_a_slice_smaller_than_k_is_padded():
    import faiss

    index = faiss.IndexFlatIP(2)
    index.add(np.eye(2, dtype=np.float32))
    out = search_slice(index, np.array([[1.0, 0.0]], dtype=np.float32), 3, rank=1, world=4)
    assert out[0, :, 1].tolist() == [1.0, 5.0, -1.0] and out[0, 2, 0] == -np.inf


def test_one_process_holds_every_vector():
    from dpr.training.corpus_negatives import CorpusNegatives

    corpus = CorpusNegatives([f"d{i}" for i in range(9)], ["t"] * 9, [""] * 9, positions=list(range(9)), max_corpus=0)
    corpus.set_vectors(torch.randn(9, 4), 0)
    assert not corpus.sharded and corpus.vectors.shape == (9, 4) and corpus.whole_vectors() is corpus.vectors


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, tiny_model_dir):
    from tests.conftest import write_tiny_dataset

    out = tmp_path_factory.mktemp("slices")
    write_tiny_dataset(out / "data" / "tiny")
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(HERE / "corpus_slices_worker.py"),
           "--model-dir", str(tiny_model_dir), "--data-dir", str(out / "data"), "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_sliced_step_equals_the_step_with_every_vector(two_ranks):
    for rank, res in enumerate(two_ranks):
        assert res["world"] == 2
        sliced, whole = res["step"]["sliced"], res["step"]["whole"]
        assert sliced["sharded"] and not whole["sharded"]
        assert sliced["rows"] == len(slice_rows(37, rank, 2)) and whole["rows"] == 37  # n / world rows kept
        assert sliced["slice_equal"] and sliced["gathered_equal"] and whole["gathered_equal"]
        for key in ("ids", "targets", "vectors", "positive", "ignore", "loss", "grad"):
            assert sliced[key] == whole[key], (rank, key)
        assert len(sliced["ids"]) > 5 and any(any(row) for row in sliced["ignore"])  # top-k of several, answers


@pytest.mark.slow
def test_sliced_refresh_encodes_and_keeps_its_rows(two_ranks):
    for rank, res in enumerate(two_ranks):
        enc = res["encoded"]
        assert enc["rows"] == len(slice_rows(11, rank, 2)) and enc["whole_rows"] == 11
        assert enc["max_diff"] < 1e-5


@pytest.mark.slow
def test_training_on_slices_logs_the_numbers_of_training_on_every_vector(two_ranks):
    for rank, res in enumerate(two_ranks):
        sliced, whole = res["training"]["sliced"], res["training"]["whole"]
        assert sliced["sharded"] and not whole["sharded"]
        assert sliced["rows"] == 4 and whole["rows"] == 8  # the 8-passage sample, 2 ranks
        assert sliced["steps"] == whole["steps"] == 4
        assert sliced["reused_rows"] == whole["reused_rows"] == [8]  # validation reused every row, gathered
        assert sliced["logged"] and sliced["logged"] == whole["logged"]


def test_all_to_all_alone_returns_its_own_chunk():
    from dpr import distributed as dist

    chunk = torch.arange(6).reshape(3, 2)
    assert [c.tolist() for c in dist.all_to_all_rows([chunk])] == [chunk.tolist()]
