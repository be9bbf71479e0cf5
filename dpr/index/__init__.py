"""FAISS indexes over `dpr-encode` shards: build (CPU or GPUs), save/load with passage ids, search."""

from dpr.index.build import (BuildOptions, bytes_per_passage, build_index, default_nlist, default_pq_m, resolve_factory,
                             set_search_params)
from dpr.index.gpu import gpu_count, to_cpu, to_gpus
from dpr.index.search import search
from dpr.index.storage import build_and_save, load_index, read_index_meta, save_index

__all__ = [
    "BuildOptions", "build_index", "build_and_save", "save_index", "load_index", "read_index_meta", "search",
    "set_search_params", "resolve_factory", "default_nlist", "default_pq_m", "bytes_per_passage",
    "gpu_count", "to_gpus", "to_cpu",
]
