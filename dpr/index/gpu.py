"""Moving FAISS indexes between CPU and GPUs, with a CPU fallback when faiss has no GPU support."""

from __future__ import annotations

import logging

import faiss

log = logging.getLogger(__name__)


def gpu_count() -> int:
    """Visible GPUs faiss can use; 0 for faiss-cpu builds."""
    get = getattr(faiss, "get_num_gpus", None)
    try:
        return int(get()) if get is not None else 0
    except RuntimeError:  # a GPU build on a machine without a driver
        return 0


def is_gpu_index(index: faiss.Index) -> bool:
    """True for a GpuIndex* or a shard/replica container of them."""
    name = type(index).__name__
    if name.startswith("GpuIndex"):
        return True
    if isinstance(index, (faiss.IndexShards, faiss.IndexReplicas)):
        return index.count() > 0 and is_gpu_index(index.at(0))
    return False


def _has_pq(index: faiss.Index) -> bool:
    ivf = faiss.try_extract_index_ivf(index)
    return ivf is not None and isinstance(faiss.downcast_index(ivf), faiss.IndexIVFPQ)


def to_gpus(index: faiss.Index, shard: bool = True, use_float16: bool | None = None) -> faiss.Index:
    """Copy ``index`` onto every visible GPU (sharded across them by default, so capacity adds up).

    ``use_float16`` (default: only for IVF-PQ) makes the cloner use float16 PQ lookup tables: with
    float32 tables, m=48 sub-quantizers × 256 × 4 bytes exceed a GPU block's shared memory. Flat
    vectors stay float32 (float16 storage would change scores).

    Falls back to the CPU index with a warning when faiss has no GPU support, no GPU is visible, or
    the index type has no GPU implementation (e.g. HNSW).
    """
    n = gpu_count()
    if n == 0 or not hasattr(faiss, "GpuMultipleClonerOptions"):
        log.warning("device=gpu requested but faiss has no usable GPU (faiss-cpu build or no visible GPU); "
                    "staying on CPU")
        return index
    co = faiss.GpuMultipleClonerOptions()
    co.shard = shard
    co.useFloat16 = _has_pq(index) if use_float16 is None else use_float16
    try:
        gpu_index = faiss.index_cpu_to_all_gpus(index, co=co)
    except RuntimeError as err:  # e.g. "index type not supported on GPU"
        log.warning("index %s cannot move to GPU (%s); staying on CPU", type(index).__name__, err)
        return index
    log.info("index on %d GPU(s) (%s)", n, "sharded" if shard else "replicated")
    return gpu_index


def to_cpu(index: faiss.Index) -> faiss.Index:
    """A CPU copy of a GPU index (shards merged back into one index); CPU indexes pass through."""
    if is_gpu_index(index):
        return faiss.index_gpu_to_cpu(index)
    return index


def gpu_clustering_index(dim: int, metric: int = faiss.METRIC_L2) -> faiss.Index | None:
    """A flat index on all GPUs for IVF k-means assignment (same metric as the IVF quantizer, so the
    lists come out as a CPU build would make them), or None without GPU support."""
    if gpu_count() == 0 or not hasattr(faiss, "index_cpu_to_all_gpus"):
        return None
    flat = faiss.IndexFlatIP(dim) if metric == faiss.METRIC_INNER_PRODUCT else faiss.IndexFlatL2(dim)
    return faiss.index_cpu_to_all_gpus(flat)
