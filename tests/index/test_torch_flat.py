"""The torch exact search (index.device=gpu without faiss-gpu) gives faiss IndexFlatIP's / IndexFlatL2's top-k.

Run on the CPU here (float32: the same search as faiss); on a GPU the same code runs on cuda."""

from __future__ import annotations

import logging

import faiss
import numpy as np
import pytest
import torch

from dpr.index import gpu, search
from dpr.index.torch_flat import TorchFlatIndex


def _vectors(n, d, seed, normalize=True):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True) if normalize else x


def _flat(x, metric=faiss.METRIC_INNER_PRODUCT):
    index = faiss.IndexFlatIP(x.shape[1]) if metric == faiss.METRIC_INNER_PRODUCT else faiss.IndexFlatL2(x.shape[1])
    index.add(x)
    return index


def _same_topk(D_ref, I_ref, D, I, tol=1e-5):
    """Equal scores within ``tol``; equal rows except where faiss's own scores tie within ``tol`` (there the
    order among near-equal scores is rounding, not the search)."""
    np.testing.assert_allclose(D, D_ref, rtol=tol, atol=tol)
    for q in range(len(I)):
        for j in np.nonzero(I[q] != I_ref[q])[0]:
            near = np.abs(D_ref[q] - D_ref[q, j]) <= tol
            assert near.sum() > 1 or j == len(I[q]) - 1 and np.isclose(D[q, j], D_ref[q, j], atol=tol), (q, j)


@pytest.mark.parametrize("metric", [faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2])
@pytest.mark.parametrize("chunk_rows", [None, 97, 1000])  # one chunk, many (uneven), chunk > corpus
def test_equals_faiss_flat(metric, chunk_rows):
    x, q = _vectors(3000, 48, 0, metric == faiss.METRIC_INNER_PRODUCT), _vectors(70, 48, 1)
    index = _flat(x, metric)
    D_ref, I_ref = index.search(q, 20)
    D, I = TorchFlatIndex(index, device="cpu", chunk_rows=chunk_rows).search(q, 20)
    _same_topk(D_ref, I_ref, D, I)
    assert (I == I_ref).mean() > 0.99


def test_ties_lower_row_first_even_at_the_kth_place():
    # small integers: every dot product exact whatever the kernel, so copies tie exactly
    rng = np.random.default_rng(2)
    base = rng.integers(-4, 5, (10, 16)).astype(np.float32)
    x = np.concatenate([base, base, base])  # every vector three times: rows r, r+10, r+20 tie
    index = _flat(x)
    q = rng.integers(-4, 5, (6, 16)).astype(np.float32)
    q = q[[len(set((base @ v).tolist())) == 10 for v in q]]  # queries whose 10 distinct vectors score apart
    assert len(q) >= 2
    for chunk in (None, 7):
        D, I = TorchFlatIndex(index, device="cpu", chunk_rows=chunk).search(q, 5)  # 5 = 3 + 2 of the next triple
        for row, scores in zip(I, D):
            best = row[0]
            assert list(row[:3]) == [best, best + 10, best + 20]
            second = row[3]
            assert second < 10 and row[4] == second + 10  # the third copy loses the 5th place: higher row
            assert scores[0] == scores[1] == scores[2] and scores[3] == scores[4]
        D_ref, I_ref = index.search(q, 5)
        np.testing.assert_allclose(D, D_ref, rtol=1e-5, atol=1e-5)
        assert [sorted(set(r)) for r in (I % 10)] == [sorted(set(r)) for r in (I_ref % 10)]


def test_fewer_vectors_than_k_and_search_wrapper():
    x = _vectors(5, 8, 4)
    ids = [f"p{i}" for i in range(5)]
    index = TorchFlatIndex(_flat(x), device="cpu")
    D, I = index.search(x[:2], 8)
    assert (I[:, 5:] == -1).all() and np.isneginf(D[:, 5:]).all() and list(I[:, 0]) == [0, 1]
    hits, scores = search(index, ids, x[:2], k=3, progress=False)  # dpr.index.search takes it as a faiss index
    ref_hits, ref_scores = search(_flat(x), ids, x[:2], k=3, progress=False)
    assert hits == ref_hits
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_vectors_close(dtype):
    x, q = _vectors(2000, 64, 5), _vectors(30, 64, 6)
    index = _flat(x)
    D_ref, I_ref = index.search(q, 10)
    D, I = TorchFlatIndex(index, device="cpu", dtype=dtype).search(q, 10)
    assert np.abs(D - D_ref).max() < (0.02 if dtype == "bfloat16" else 0.005)
    assert (I[:, 0] == I_ref[:, 0]).mean() >= 0.9
    with pytest.raises(ValueError, match="search dtype"):
        TorchFlatIndex(index, device="cpu", dtype="int8")


def test_gpu_request_takes_the_torch_path_once(monkeypatch, caplog):
    """faiss-cpu with a GPU torch: device=gpu gives the torch search for a flat index, said once; an IVF
    index stays on the CPU with a warning. (The torch device is faked as the CPU here.)"""
    if gpu.gpu_count() > 0:
        pytest.skip("faiss has GPU support here: its own GPU index is used")
    monkeypatch.setattr(gpu, "torch_search_device", lambda: "cpu")
    monkeypatch.setattr(gpu, "_said", set())
    x = _vectors(500, 16, 7)
    with caplog.at_level(logging.INFO, logger="dpr.index.gpu"):
        a = gpu.to_gpus(_flat(x))
        b = gpu.to_gpus(_flat(x), torch_dtype="float16")
    assert isinstance(a, TorchFlatIndex) and isinstance(b, TorchFlatIndex) and b.xb.dtype == torch.float16
    assert caplog.text.count("exact flat search in torch") == 1
    assert gpu.to_cpu(a).ntotal == 500  # saving hands back the faiss index
    ivf = faiss.index_factory(16, "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(x)
    with caplog.at_level(logging.WARNING):
        assert gpu.to_gpus(ivf) is ivf
    assert "flat indexes only" in caplog.text
