"""Exact (brute-force) search in torch: the GPU path when faiss has no GPU support.

PyPI's faiss-gpu is built for one CUDA major version and pulls its own CUDA libraries (135 MB for CUDA 12), so
on a machine whose torch has another CUDA, ``index.device=gpu`` would otherwise stay on the CPU. A flat index
needs no faiss kernel: a matmul of the queries against the corpus, chunk by chunk, and a running top-k.

`TorchFlatIndex` answers ``search(queries, k) -> (D, I)`` as a faiss ``IndexFlatIP`` / ``IndexFlatL2`` does
(inner products best first; squared L2 distances smallest first), with ``d``, ``ntotal`` and ``metric_type``,
so `dpr.index.search` uses it unchanged. Equal scores come out lower row first (also at the k-th place: the
chunk is sorted stably when a tie straddles it). On the CPU in float32 it is the same search as faiss
(tests/index/test_torch_flat.py); ``dtype=float16/bfloat16`` stores and multiplies the vectors in half
precision (half the memory, tensor cores), scores then rounded as that dtype computes them.
"""

from __future__ import annotations

import logging

import faiss
import numpy as np
import torch

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
# scores held at once per query batch (q x chunk floats): 2**26 = 256 MB in float32
SCORE_BUDGET = 2 ** 26


def flat_vectors(index: faiss.Index) -> np.ndarray:
    """The stored vectors of a faiss flat index, [ntotal, d] float32 (a copy)."""
    inner = faiss.downcast_index(index)
    if not isinstance(inner, faiss.IndexFlat):
        raise TypeError(f"exact torch search needs a flat index, got {type(inner).__name__}")
    return faiss.rev_swig_ptr(inner.get_xb(), inner.ntotal * inner.d).reshape(inner.ntotal, inner.d).copy()


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[str(dtype)]
    except KeyError:
        raise ValueError(f"search dtype must be one of {sorted(DTYPES)}, got {dtype!r}") from None


class TorchFlatIndex:
    """A flat index's vectors on a torch device, searched exactly (module doc)."""

    def __init__(self, index: faiss.Index, device: str | torch.device = "cuda",
                 dtype: str | torch.dtype = "float32", chunk_rows: int | None = None) -> None:
        metric = index.metric_type
        if metric not in (faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2):
            raise ValueError(f"exact torch search supports inner product and L2, not faiss metric {metric}")
        self.cpu_index = index  # kept: to_cpu() and save_index() hand this back
        self.d, self.ntotal, self.metric_type = int(index.d), int(index.ntotal), metric
        self.device, self.dtype = torch.device(device), _dtype(dtype)
        self.chunk_rows = chunk_rows
        self.xb = torch.from_numpy(flat_vectors(index)).to(self.device, self.dtype)
        # ||x||^2 in float32 from the stored (possibly half) vectors, for L2
        self.norms = self.xb.float().pow(2).sum(1) if metric == faiss.METRIC_L2 else None

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(D, I) as faiss returns them: [n, k] scores (IP: larger first; L2: squared distance, smaller first)
        and row numbers, -1 / -inf (IP) or +inf (L2) where the index holds fewer than k vectors."""
        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
        n = q.shape[0]
        kk = min(int(k), self.ntotal)
        D = np.full((n, k), np.inf if self.metric_type == faiss.METRIC_L2 else -np.inf, dtype=np.float32)
        I = np.full((n, k), -1, dtype=np.int64)
        if n == 0 or kk <= 0:
            return D, I
        q = q.to(self.device, self.dtype)
        chunk = self.chunk_rows or max(kk, SCORE_BUDGET // max(n, 1))
        best_s = best_i = None
        with torch.inference_mode():
            for start in range(0, self.ntotal, chunk):
                s = self._scores(q, start, start + chunk)
                top_s, top_i = _topk_stable(s, min(kk, s.shape[1]))
                top_i += start
                if best_s is None:
                    best_s, best_i = top_s, top_i
                else:  # merge: candidates in row order within each side, earlier chunks first
                    best_s, best_i = _merge(best_s, best_i, top_s, top_i, kk)
        scores = best_s.float()
        if self.metric_type == faiss.METRIC_L2:
            scores = -scores  # searched as the largest -distance
        D[:, :kk] = scores.cpu().numpy()
        I[:, :kk] = best_i.cpu().numpy()
        return D, I

    def _scores(self, q: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """[n, hi-lo] scores, higher better: inner products, or minus squared L2 distances."""
        xb = self.xb[lo:hi]
        s = (q @ xb.T).float()
        if self.metric_type == faiss.METRIC_L2:
            s = 2 * s - self.norms[lo:hi] - q.float().pow(2).sum(1, keepdim=True)
        return s


def _topk_stable(s: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top ``k`` per row, ties lower column first, also among equal values at the k-th place."""
    top_s, top_i = torch.topk(s, k, dim=1)
    kth = top_s[:, -1:]
    # topk may pick any of several columns equal to the k-th value: where more exist than it kept, sort
    ties_here = (s == kth).sum(1) > (top_s == kth).sum(1)
    top_s, top_i = _order(top_s, top_i)
    if ties_here.any():
        rows = ties_here.nonzero().squeeze(1)
        order = torch.sort(s[rows], dim=1, descending=True, stable=True)
        top_s[rows], top_i[rows] = order.values[:, :k], order.indices[:, :k]
    return top_s, top_i


def _order(s: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each row by score descending, then row number ascending."""
    by_id = torch.argsort(i, dim=1)
    s, i = s.gather(1, by_id), i.gather(1, by_id)
    by_score = torch.sort(s, dim=1, descending=True, stable=True).indices
    return s.gather(1, by_score), i.gather(1, by_score)


def _merge(s1: torch.Tensor, i1: torch.Tensor, s2: torch.Tensor, i2: torch.Tensor,
           k: int) -> tuple[torch.Tensor, torch.Tensor]:
    s, i = _order(torch.cat([s1, s2], 1), torch.cat([i1, i2], 1))
    return s[:, :k], i[:, :k]
