"""Moving FAISS indexes between CPU and GPUs. When faiss has no GPU support, a flat index is searched exactly
in torch on the GPU (`dpr.index.torch_flat`), other index types stay on the CPU; either way it is said once."""

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


_said: set[str] = set()


def _say_once(key: str, msg: str, *args: object, level: int = logging.WARNING) -> None:
    if key not in _said:
        _said.add(key)
        log.log(level, msg, *args)


def torch_search_device() -> str | None:
    """The torch device an exact search runs on when faiss has no GPU: this process's GPU
    (`dpr.distributed.device`), or None."""
    import torch

    from dpr.distributed import device

    return str(device()) if torch.cuda.is_available() else None


def to_torch(index: faiss.Index, device: str, dtype: str = "float32") -> faiss.Index:
    """``index`` (flat) searched exactly in torch on ``device`` (`dpr.index.torch_flat.TorchFlatIndex`)."""
    from dpr.index.torch_flat import TorchFlatIndex

    return TorchFlatIndex(index, device=device, dtype=dtype)


def is_flat(index: faiss.Index) -> bool:
    return isinstance(faiss.downcast_index(index), faiss.IndexFlat)


def to_gpus(index: faiss.Index, shard: bool = True, use_float16: bool | None = None,
            torch_dtype: str = "float32") -> faiss.Index:
    """Copy ``index`` onto every visible GPU (sharded across them by default, so capacity adds up).

    ``use_float16`` (default: only for IVF-PQ) makes the cloner use float16 PQ lookup tables: with
    float32 tables, m=48 sub-quantizers × 256 × 4 bytes exceed a GPU block's shared memory. Flat
    vectors stay float32 (float16 storage would change scores).

    When faiss has no GPU support (a faiss-cpu build) but torch sees a GPU, a flat index is searched
    exactly in torch on this process's GPU, its vectors in ``torch_dtype`` (float32, or float16/bfloat16:
    half the memory, scores rounded to that precision). Otherwise falls back to the CPU index with a warning
    (no GPU visible, or an index type with no GPU implementation, e.g. HNSW; IVF without faiss-gpu). The torch
    path is said once per process, the CPU fallback every time.
    """
    n = gpu_count()
    if n == 0 or not hasattr(faiss, "GpuMultipleClonerOptions"):
        where = torch_search_device() if is_flat(index) else None
        if where is not None:
            _say_once("torch", "index.device=gpu: faiss has no GPU support here; exact flat search in torch on %s "
                      "(vectors in %s)", where, torch_dtype, level=logging.INFO)
            return to_torch(index, where, torch_dtype)
        why = ("a faiss-cpu build; the torch exact search covers flat indexes only, not "
               f"{type(faiss.downcast_index(index)).__name__}" if not is_flat(index) else "no visible GPU")
        log.warning("device=gpu requested but faiss has no usable GPU (%s); staying on CPU", why)
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
    cpu_index = getattr(index, "cpu_index", None)  # a TorchFlatIndex keeps the flat index it was made from
    if cpu_index is not None:
        return cpu_index
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
