"""Exact search straight from the memory-mapped embedding shards, sharded over devices: a flat index's search
without its host copy.

A flat index file holds every vector in float32 (64.5 GB for 21M passages at 768 dims); reading it, or copying
its vectors out of faiss (`dpr.index.torch_flat`), puts all of that in host memory before a GPU sees any of it.
The shards `dpr-encode` wrote (``shard_*.npy``, float16 by default: half the size) hold the same vectors.
`ShardFlatSearch` reads them through ``np.load(mmap_mode="r")``, ``block_rows`` rows at a time:

- on GPUs (``resident``): each device gets a contiguous slice of the rows, copied to it block by block (host
  memory: one block), stored in ``dtype`` (float16: the shards' own values when they were encoded in float16);
- on the CPU (a stand-in for the devices, or a machine without GPUs): every search streams the blocks from the
  page cache, never holding more than one block converted to float32.

Scores are computed in ``compute_dtype`` (float32 by default: each block is widened before the product, so the
scores are those of faiss's flat index over the same vectors up to summation order; float16 uses the tensor cores,
scores then rounded to half precision). Each device keeps its top k (ties: lower row first, `dpr.index.torch_flat`)
and the devices' lists are merged in row order. The search answers ``search(queries, k) -> (D, I)`` as a faiss
flat index does, with ``d``, ``ntotal`` and ``metric_type``, so `dpr.index.search` uses it unchanged.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import faiss
import numpy as np
import torch

from dpr.index.shards import Shard, embeddings_info, list_shards
from dpr.index.torch_flat import SCORE_BUDGET, _dtype, _merge, _topk_stable

log = logging.getLogger(__name__)

BLOCK_ROWS = 65_536  # rows read (and, for GPUs, copied) at a time: 96 MB of float16 at 768 dims


@dataclass
class _Block:
    """``rows`` rows of one shard starting at global row ``offset``: a resident tensor, or (streamed) the shard's
    memory map and the row range within it."""

    offset: int
    rows: int
    tensor: torch.Tensor | None = None
    source: np.ndarray | None = None
    lo: int = 0


def _split(total: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous row ranges covering ``[0, total)``, sizes differing by at most one."""
    base, extra = divmod(total, parts)
    out, pos = [], 0
    for p in range(parts):
        size = base + (p < extra)
        out.append((pos, pos + size))
        pos += size
    return out


class ShardFlatSearch:
    """Exact top-k over embedding shards, the rows sharded over ``devices`` (module doc)."""

    def __init__(self, shards: Sequence[Shard], metric: int = faiss.METRIC_INNER_PRODUCT,
                 devices: Sequence[str | torch.device] = ("cpu",), dtype: str = "float16",
                 compute_dtype: str = "float32", block_rows: int = BLOCK_ROWS, resident: bool | None = None) -> None:
        if metric not in (faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2):
            raise ValueError(f"exact shard search supports inner product and L2, not faiss metric {metric}")
        if not devices:
            raise ValueError("ShardFlatSearch needs at least one device")
        info = embeddings_info(list(shards))
        self.d, self.ntotal, self.metric_type = int(info["dim"]), int(info["count"]), metric
        self.dtype, self.compute_dtype = _dtype(dtype), _dtype(compute_dtype)
        self.devices = [torch.device(d) for d in devices]
        self.block_rows = max(1, int(block_rows))
        maps = [(s.vectors(), start) for s, start in zip(shards, np.cumsum([0] + [s.count for s in shards]))]
        self.parts: list[tuple[torch.device, list[_Block]]] = []
        for dev, (lo, hi) in zip(self.devices, _split(self.ntotal, len(self.devices))):
            keep = dev.type != "cpu" if resident is None else resident
            self.parts.append((dev, self._blocks(maps, lo, hi, dev if keep else None)))
        where = ", ".join(str(d) for d in self.devices)
        log.info("exact search over %d passages × %d dims from %d memory-mapped shard(s) on %s (%s)", self.ntotal,
                 self.d, len(shards), where, "resident in " + str(self.dtype) if self.parts[0][1] and
                 self.parts[0][1][0].tensor is not None else "streamed from the page cache")

    def _blocks(self, maps: list[tuple[np.ndarray, int]], lo: int, hi: int,
                device: torch.device | None) -> list[_Block]:
        """The blocks of global rows ``[lo, hi)``; copied to ``device`` one block at a time when given."""
        blocks = []
        for arr, start in maps:
            a, b = max(lo, int(start)), min(hi, int(start) + arr.shape[0])
            for s in range(a, b, self.block_rows):
                e = min(s + self.block_rows, b)
                block = _Block(offset=s, rows=e - s, source=arr, lo=s - int(start))
                if device is not None:  # one block of host memory at a time, then on the device
                    host = torch.from_numpy(np.array(arr[block.lo:block.lo + block.rows]))
                    block.tensor, block.source = host.to(device=device, dtype=self.dtype), None
                blocks.append(block)
        return blocks

    def _block_tensor(self, block: _Block, device: torch.device) -> torch.Tensor:
        if block.tensor is not None:
            return block.tensor
        # streamed: this block of the memory map, widened on its own (the only host copy made; none for float32
        # shards, whose read-only pages torch then reads in place: nothing here writes to them)
        view = np.asarray(block.source[block.lo:block.lo + block.rows], dtype=np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "not writable": read only, never written
            return torch.from_numpy(view).to(device)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(D, I) as faiss returns them: scores (IP: larger first; L2: squared distance, smaller first) and row
        numbers, -1 / -inf (IP) or +inf (L2) where the index holds fewer than k vectors."""
        q32 = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
        n, kk = q32.shape[0], min(int(k), self.ntotal)
        D = np.full((n, k), np.inf if self.metric_type == faiss.METRIC_L2 else -np.inf, dtype=np.float32)
        I = np.full((n, k), -1, dtype=np.int64)
        if n == 0 or kk <= 0:
            return D, I
        best_s = best_i = None
        with torch.inference_mode():
            for device, blocks in self.parts:  # in row order: the merge keeps lower rows first on ties
                top = self._search_part(q32, kk, device, blocks)
                if top is None:
                    continue
                s, i = top[0].cpu(), top[1].cpu()
                best_s, best_i = (s, i) if best_s is None else _merge(best_s, best_i, s, i, kk)
        scores = best_s.float()
        if self.metric_type == faiss.METRIC_L2:
            scores = -scores  # searched as the largest -distance
        D[:, :kk] = scores.numpy()
        I[:, :kk] = best_i.numpy()
        return D, I

    def _search_part(self, q32: torch.Tensor, kk: int, device: torch.device,
                     blocks: list[_Block]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One device's top ``kk`` over its blocks (global row numbers), or None when it holds no rows."""
        q = q32.to(device, self.compute_dtype)
        q_norm = q.float().pow(2).sum(1, keepdim=True) if self.metric_type == faiss.METRIC_L2 else None
        chunk = max(kk, SCORE_BUDGET // max(q.shape[0], 1))
        best_s = best_i = None
        for block in blocks:
            xb_all = self._block_tensor(block, device)
            for a in range(0, block.rows, chunk):
                xb = xb_all[a:a + chunk].to(self.compute_dtype)
                s = (q @ xb.T).float()
                if q_norm is not None:
                    s = 2 * s - xb.float().pow(2).sum(1) - q_norm
                top_s, top_i = _topk_stable(s, min(kk, s.shape[1]))
                top_i += block.offset + a
                best_s, best_i = (top_s, top_i) if best_s is None else _merge(best_s, best_i, top_s, top_i, kk)
        return None if best_s is None else (best_s, best_i)


def search_devices() -> list[str]:
    """The devices an exact search shards over: every visible GPU in a single process; this rank's GPU only
    under torchrun (each rank searches its own questions). Empty without CUDA."""
    from dpr.distributed import device

    if not torch.cuda.is_available():
        return []
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return [str(device())]
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def open_shard_search(meta: dict, index_path: str | Path, devices: Sequence[str],
                      dtype: str | None = None) -> ShardFlatSearch | None:
    """The exact search over the shards a flat index was built from (``meta``: the index's metadata, which names
    its embeddings directory), or None where that cannot stand for the index: not a flat index, the directory
    gone, or shards that are not the index's (another model or passages file, another count). ``dtype``: how the
    devices store the vectors (None: as the shards do)."""
    if str(meta.get("factory", "")).strip() != "Flat" or not meta.get("embeddings") or not devices:
        return None
    try:
        shards = list_shards(meta["embeddings"])
    except (OSError, ValueError) as err:  # DataError is a ValueError
        log.info("%s: its embeddings are not usable for a search from the shards (%s); reading the index", index_path,
                 err)
        return None
    info = embeddings_info(shards)
    same = all(info.get(k) == meta.get(k) for k in ("model_fingerprint", "passages_sha256", "count", "dim"))
    if not same:
        log.info("%s: the shards in %s changed since the index was built; reading the index", index_path,
                 meta["embeddings"])
        return None
    metric = faiss.METRIC_L2 if meta.get("metric") == "l2" else faiss.METRIC_INNER_PRODUCT
    return ShardFlatSearch(shards, metric=metric, devices=devices, dtype=dtype or str(info["dtype"]))


def from_shards(index_path: str | Path, meta: dict, ids_file: str | Path,
                search_dtype: str = "float32") -> tuple[ShardFlatSearch, Sequence[str]] | None:
    """``load_index(device="gpu")`` for a flat index where faiss has no GPU support: its shards searched in place
    on `search_devices` (vectors in the shards' own dtype, or ``search_dtype`` where that is a half type), with
    the index's ids (``meta``: the index's metadata, ``ids_file``: its ids, both as `dpr.index.storage` reads
    them); None where the index must be read instead (faiss-gpu present, no GPU, `open_shard_search`)."""
    from dpr.index import gpu
    from dpr.index.shards import IdList

    devices = search_devices()
    if gpu.gpu_count() > 0 or not devices:
        return None
    half = _dtype(search_dtype) in (torch.float16, torch.bfloat16)
    found = open_shard_search(meta, index_path, devices, dtype=search_dtype if half else None)
    if found is None:
        return None
    ids = IdList.read(ids_file)
    if len(ids) != found.ntotal:
        return None
    return found, ids

