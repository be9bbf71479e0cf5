"""Exact search read from the memory-mapped embedding shards (GPU search without faiss-gpu), run here on CPU
tensors standing in for the GPUs: the same top k as faiss's flat index, and no host copy of the index."""

from __future__ import annotations

import tracemalloc

import faiss
import numpy as np
import pytest
import torch

from dpr.index import build_and_save, load_index, search, shard_search
from dpr.index.shard_search import ShardFlatSearch
from dpr.index.shards import list_shards, write_shard
from dpr.index.torch_flat import TorchFlatIndex


def _write(root, x, num_shards, dtype=np.float16):
    ids = [f"p{i}" for i in range(len(x))]
    bounds = np.linspace(0, len(x), num_shards + 1).astype(int)
    for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        write_shard(root, s, num_shards, x[a:b].astype(dtype), ids[a:b], start=int(a), end=int(b), total=len(x),
                    model="m", model_fingerprint="sha256:m", passages_sha256="sha256:p")
    return ids


def _flat(x, metric):
    index = faiss.IndexFlatIP(x.shape[1]) if metric == faiss.METRIC_INNER_PRODUCT else faiss.IndexFlatL2(x.shape[1])
    index.add(np.ascontiguousarray(x, dtype=np.float32))
    return index


@pytest.mark.parametrize("metric", [faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2])
@pytest.mark.parametrize("devices,resident", [(["cpu"], False), (["cpu", "cpu", "cpu"], False),
                                               (["cpu", "cpu"], True)])
def test_integer_vectors_give_faiss_flat_ids_exactly(tmp_path, metric, devices, resident):
    # small integers: every product exact in float16 storage and float32 scores, so ties are real ties
    rng = np.random.default_rng(0)
    x = rng.integers(-8, 9, (1000, 24)).astype(np.float32)
    q = rng.integers(-8, 9, (40, 24)).astype(np.float32)
    _write(tmp_path, x, 3)
    D_ref, I_ref = _flat(x, metric).search(q, 10)
    index = ShardFlatSearch(list_shards(tmp_path), metric=metric, devices=devices, block_rows=97, resident=resident)
    D, I = index.search(q, 10)
    np.testing.assert_array_equal(D, D_ref)  # exact integers: the same scores to the last bit
    # the rows: best first, equal scores lower row first (faiss orders ties as its kernel meets them)
    exact = q.astype(np.float64) @ x.T.astype(np.float64)
    key = -exact if metric == faiss.METRIC_INNER_PRODUCT else \
        ((q[:, None, :].astype(np.float64) - x[None]) ** 2).sum(-1)
    want = np.array([np.lexsort((np.arange(len(x)), row))[:10] for row in key])
    np.testing.assert_array_equal(I, want)
    # where no other passage of the corpus has the same score, faiss's row is the row
    untied = np.array([[np.sum(key[r] == key[r, j]) == 1 for j in I_ref[r]] for r in range(len(q))])
    assert untied.mean() > 0.3
    np.testing.assert_array_equal(I[untied], I_ref[untied])


def test_float_vectors_match_faiss_flat(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3000, 32)).astype(np.float16)  # the shards' float16 values are the index's vectors
    q = rng.standard_normal((25, 32)).astype(np.float32)
    _write(tmp_path, x, 2)
    D_ref, I_ref = _flat(x, faiss.METRIC_INNER_PRODUCT).search(q, 20)
    D, I = ShardFlatSearch(list_shards(tmp_path), devices=["cpu", "cpu"], block_rows=500).search(q, 20)
    np.testing.assert_allclose(D, D_ref, rtol=1e-5, atol=1e-4)
    assert (I == I_ref).mean() > 0.99


def test_reads_the_shards_in_blocks_without_a_host_copy(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((20_000, 64)).astype(np.float32)
    q = rng.standard_normal((8, 64)).astype(np.float32)
    _write(tmp_path, x, 2, dtype=np.float32)
    full = x.nbytes  # 5 MB: what a host copy of the index costs
    shards = list_shards(tmp_path)

    def peak(fn):
        tracemalloc.start()
        try:
            fn()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    index = ShardFlatSearch(shards, devices=["cpu", "cpu"], block_rows=1000)
    for _, blocks in index.parts:  # each block a view of a shard's memory map, not a copy
        assert all(isinstance(b.source, np.memmap) and b.tensor is None and b.rows <= 1000 for b in blocks)
    assert peak(lambda: ShardFlatSearch(shards, devices=["cpu", "cpu"], block_rows=1000).search(q, 10)) < full / 8
    # the copy this replaces: faiss's flat index read whole, its vectors copied out for torch
    flat = _flat(x, faiss.METRIC_INNER_PRODUCT)
    assert peak(lambda: TorchFlatIndex(flat, device="cpu").search(q, 10)) >= full


def test_load_index_on_gpu_searches_the_shards(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((600, 16)).astype(np.float16)
    ids = _write(tmp_path / "emb", x, 2)
    build_and_save(tmp_path / "emb", tmp_path / "index.faiss", factory="Flat")
    monkeypatch.setattr(shard_search, "search_devices", lambda: ["cpu", "cpu"])  # two stand-in GPUs
    reads = []
    monkeypatch.setattr(faiss, "read_index", lambda *a: reads.append(a))
    index, got_ids = load_index(tmp_path / "index.faiss", device="gpu")
    assert isinstance(index, ShardFlatSearch) and not reads and got_ids == ids
    monkeypatch.undo()
    ref, _ = load_index(tmp_path / "index.faiss")
    q = rng.standard_normal((5, 16)).astype(np.float32)
    hits, scores = search(index, got_ids, q, 7, progress=False)
    ref_hits, ref_scores = search(ref, ids, q, 7, progress=False)
    assert hits == ref_hits
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


def test_changed_shards_fall_back_to_the_index(tmp_path, monkeypatch):
    x = np.random.default_rng(4).standard_normal((50, 8)).astype(np.float16)
    _write(tmp_path / "emb", x, 1)
    build_and_save(tmp_path / "emb", tmp_path / "index.faiss", factory="Flat")
    _write(tmp_path / "emb", x[:40], 1)  # re-encoded since: 40 passages, the index holds 50
    monkeypatch.setattr(shard_search, "search_devices", lambda: ["cpu"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    index, ids = load_index(tmp_path / "index.faiss", device="gpu")
    assert not isinstance(index, ShardFlatSearch) and index.ntotal == 50 and len(ids) == 50


def test_id_list_is_the_ids_without_a_string_each(tmp_path):
    from hypothesis import given, settings, strategies as st

    from dpr.index.shards import IdList, read_ids, write_ids

    path = tmp_path / "x.ids"

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\n\r\t", blacklist_categories=["Cs"]),
                            max_size=12), max_size=40))
    def check(ids):
        write_ids(path, ids)
        got = IdList.read(path)
        assert len(got) == len(ids) and list(got) == ids and got == ids and got == read_ids(path)
        if ids:
            assert got[0] == ids[0] and got[-1] == ids[-1] and got[1:3] == ids[1:3]
        assert got != ids + ["extra"]

    check()
    path.write_bytes(b"a\nb")
    with pytest.raises(ValueError, match="newline"):
        IdList.read(path)
