"""A sampled corpus's vectors held in slices across ranks, searched per slice, each question's top-k merged.

Under DDP with ``train.corpus_sample`` and FAISS top-k candidates (more passages than ``corpus_max_passages``), rank
``r`` of ``W`` keeps only the vectors of the sample's rows ``r, r + W, r + 2W, ...`` (the rows it encodes) and a FAISS
inner-product index over them: ``n / W`` rows each instead of ``n`` on every rank. Each step:

1. every rank's question vectors are gathered (detached: the search picks candidates, it carries no gradient);
2. each rank searches its slice for all of them (its top-k, as global rows);
3. each question's per-slice tops are sent to the question's rank and merged there (:func:`merge_topk`);
4. each rank asks the owners of its candidates (the union of its questions' top-k and positives) for their vectors
   (:func:`fetch_rows`).

What is guaranteed: each question gets k rows whose scores are the k best scores of the whole sample, ordered by
score, equal scores by the smaller row. The rows are those a search over the whole
sample in one index picks except among passages whose float32 scores tie (or round differently: FAISS scores a batch
of 20+ questions with BLAS, fewer one by one) at a question's k-th place, of which each index keeps any. Without such
ties the candidates, their vectors (exact copies), masks and targets, hence the loss and gradients, are those of
training with every vector on every rank.
"""

from __future__ import annotations

import numpy as np
import torch

from dpr import distributed as dist

NO_ROW = -1  # FAISS's "no neighbour" (a slice with fewer rows than k)


def slice_rows(n: int, rank: int, world: int) -> range:
    """The rows of an ``n``-row corpus that rank ``rank`` of ``world`` encodes and keeps."""
    return range(rank, n, world)


def merge_topk(scores: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """Each question's ``k`` best rows ``[Q, k]`` among candidates ``scores`` / ``rows`` ``[Q, m]`` (the slices'
    tops side by side; rows ``< 0`` are none): score descending, equal scores by the smaller row. Where fewer than
    ``k`` rows are given the tail is ``-1``."""
    rows = np.asarray(rows, dtype=np.int64)
    none = rows < 0
    keyed_scores = np.where(none, -np.inf, np.asarray(scores, dtype=np.float64))
    keyed_rows = np.where(none, np.iinfo(np.int64).max, rows)
    order = np.lexsort((keyed_rows, -keyed_scores), axis=-1)  # the last key sorts first
    top = np.take_along_axis(np.where(none, NO_ROW, rows), order, axis=-1)[:, :k]
    if top.shape[1] < k:
        top = np.concatenate([top, np.full((top.shape[0], k - top.shape[1]), NO_ROW, dtype=np.int64)], axis=1)
    return top


def search_slice(index, q: np.ndarray, k: int, rank: int, world: int) -> np.ndarray:
    """This slice's top-``k`` for questions ``q`` ``[Q, d]`` as ``[Q, k, 2]`` float64 (score, global row), padded with
    (-inf, -1) where the slice has fewer than ``k`` rows. Float64 holds float32 scores and rows below 2^53 exactly."""
    out = np.empty((q.shape[0], k, 2), dtype=np.float64)
    out[..., 0], out[..., 1] = -np.inf, NO_ROW
    kk = min(k, index.ntotal)
    if kk > 0 and q.shape[0] > 0:
        scores, idx = index.search(np.ascontiguousarray(q, dtype=np.float32), kk)
        out[:, :kk, 0] = np.where(idx >= 0, scores, -np.inf)
        out[:, :kk, 1] = np.where(idx >= 0, rank + idx.astype(np.int64) * world, NO_ROW)
    return out


def gather_questions(q: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Every rank's question vectors ``[sum B, d]`` (float32, CPU, detached) and each rank's count, in rank order."""
    local = q.detach().float().to(dist.comm_device()).contiguous()
    sizes = dist.all_gather_sizes(local.shape[0], local)
    with torch.no_grad():
        return dist.all_gather_with_grad(local, sizes).cpu(), sizes


def sharded_topk(index, q: torch.Tensor, k: int) -> np.ndarray:
    """This rank's questions' top-``k`` global rows ``[B, k]`` over all ranks' slices (``-1`` pads)."""
    rank, world = dist.rank(), dist.world_size()
    everyone, sizes = gather_questions(q)
    tops = torch.from_numpy(search_slice(index, everyone.numpy(), k, rank, world))
    received = dist.all_to_all_rows(list(tops.split(sizes)))  # rank s's tops for my questions, for each s
    side_by_side = torch.cat(received, dim=1).numpy()  # [B, world * k, 2]
    return merge_topk(side_by_side[..., 0], side_by_side[..., 1].astype(np.int64), k)


def fetch_rows(mine: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """The vectors of global ``rows`` (sorted, distinct), each from the rank that keeps it (``mine``: this rank's
    slice, :func:`slice_rows`). Every rank calls this once with its own rows."""
    rank, world = dist.rank(), dist.world_size()
    rows = np.asarray(rows, dtype=np.int64)
    owner = rows % world
    asks = [torch.from_numpy(rows[owner == o]) for o in range(world)]
    asked = dist.all_to_all_rows(asks)  # the rows each rank wants from this one
    for r, want in enumerate(asked):
        bad = want[(want % world != rank) | (want < 0)]
        if bad.numel():
            raise RuntimeError(f"rank {r} asked rank {rank} for row {int(bad[0])}, which it does not keep")
    replies = dist.all_to_all_rows([mine[torch.div(want, world, rounding_mode="floor")] for want in asked])
    out = mine.new_empty((len(rows), mine.shape[1]))
    for o in range(world):
        out[torch.from_numpy(owner == o)] = replies[o].to(out.dtype)
    return out
