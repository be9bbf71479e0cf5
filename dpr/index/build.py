"""Build a FAISS index over the embedding shards of `dpr-encode`.

The factory strings of `dpr.index.factory` work (parsed and checked before faiss sees them). Two
placeholders are filled from the data so one config fits every corpus: ``{nlist}`` (IVF lists,
≈ 4·sqrt(N) unless set) and ``{m}`` (PQ sub-quantizers, must divide the dimension; default the
largest divisor ≤ dim/8, i.e. 48 for MiniLM's 384). Every numeric parameter is checked first
(null = auto, 0 refused: `check_build_options`).
"""

from __future__ import annotations

import logging
import math
import re
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from tqdm.auto import tqdm

from dpr.checks import INT32_MAX, check_int, check_optional_int
from dpr.index import gpu
from dpr.index_config import RANGED_FIELDS, BuildOptions, field_range
from dpr.index.factory import check_filled, parse_factory
from dpr.index.shards import embeddings_info, gather_rows, iter_batches, list_shards

log = logging.getLogger(__name__)

METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}
# k-means wants about this many training points per centroid (faiss warns below 39).
MIN_POINTS_PER_CENTROID = 39


def default_nlist(count: int, train_count: int | None = None) -> int:
    """≈ 4·sqrt(N) IVF lists, capped so each list gets enough k-means training points."""
    train_count = count if train_count is None else train_count
    nlist = max(1, int(round(4 * math.sqrt(max(count, 1)))))
    return max(1, min(nlist, train_count // MIN_POINTS_PER_CENTROID))


def default_pq_m(dim: int) -> int:
    """Largest divisor of ``dim`` that is ≤ dim/8 (8 dimensions per 1-byte code: 48 for 384)."""
    target = max(1, dim // 8)
    return max(d for d in range(1, target + 1) if dim % d == 0)


def resolve_factory(factory: str, dim: int, count: int, train_count: int | None = None,
                    nlist: int | None = None, m: int | None = None) -> str:
    """Parse the factory string (`dpr.index.factory`), fill ``{nlist}``/``{m}`` and check it against the
    data before faiss sees it (faiss aborts the process on some strings and fails with C++ errors on others)."""
    train_count = count if train_count is None else train_count
    parse_factory(factory)  # the form and its literal numbers, before anything is filled in
    nlist, m = _check_field("nlist", nlist), _check_field("m", m)
    factory = factory.strip()
    if "{nlist}" in factory:
        factory = factory.replace("{nlist}", str(nlist or default_nlist(count, train_count)))
    if "{m}" in factory:
        factory = factory.replace("{m}", str(m or default_pq_m(dim)))
    check_filled(parse_factory(factory), dim, train_count)
    return factory


def check_search_params(nprobe: int | None = None, ef_search: int | None = None) -> None:
    check_optional_int("nprobe", nprobe, 1, INT32_MAX, " (null = as saved in the index)")
    check_optional_int("ef_search", ef_search, 1, INT32_MAX, " (null = as saved in the index)")


def _train_count(count: int, train_sample: int | None) -> int:
    return count if train_sample is None else min(int(train_sample), count)


def planned_factory(embeddings_dir: str | Path, factory: str = BuildOptions.factory,
                    train_sample: int | None = BuildOptions.train_sample, nlist: int | None = None,
                    m: int | None = None, **unused: Any) -> str:
    """The factory string `build_index` will use for these embeddings (placeholders filled)."""
    info = embeddings_info(list_shards(embeddings_dir))
    count = info["count"]
    return resolve_factory(factory, info["dim"], count, _train_count(count, train_sample), nlist=nlist, m=m)


def set_search_params(index: faiss.Index, nprobe: int | None = None, ef_search: int | None = None) -> None:
    """Apply query-time knobs where the index has them (IVF ``nprobe``, HNSW ``efSearch``)."""
    check_search_params(nprobe=nprobe, ef_search=ef_search)
    if not isinstance(index, faiss.Index):  # a TorchFlatIndex (dpr.index.torch_flat): exact, no knobs
        return
    ps = faiss.GpuParameterSpace() if gpu.is_gpu_index(index) else faiss.ParameterSpace()
    if nprobe is not None:
        try:
            ps.set_index_parameter(index, "nprobe", int(nprobe))
        except RuntimeError:
            log.debug("index has no nprobe; ignored")
    if ef_search is not None:
        try:
            ps.set_index_parameter(index, "efSearch", int(ef_search))
        except RuntimeError:
            log.debug("index has no efSearch; ignored")


def check_build_options(opts: BuildOptions) -> None:
    """Every build setting, before the shards are read (one-line ValueError/TypeError); the numeric ones against
    the ranges their fields declare (`dpr.index_config`)."""
    if opts.metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {opts.metric!r}")
    if opts.device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {opts.device!r}")
    parse_factory(opts.factory)
    for name in RANGED_FIELDS:
        _check_field(name, getattr(opts, name))


def _check_field(name: str, value: Any) -> Any:
    """``value`` of BuildOptions' field ``name`` (an int) in its declared range; null only where the field allows it."""
    rng, nullable = field_range(name)
    check = check_optional_int if nullable else check_int
    return check(f"index.{name}", value, int(rng.lo), int(rng.hi), f" ({rng.note})" if rng.note else "")


def build_index(embeddings_dir: str | Path, options: BuildOptions | None = None,
                **settings: Any) -> tuple[faiss.Index, list[str]]:
    """Index every shard of ``embeddings_dir`` as ``options`` say (`BuildOptions`; its fields may also be given as
    keywords, ``factory=``, ``metric=``..., which override it); returns the index and the passage id of each row.

    ``train_sample``: vectors (uniform, seeded) used to train IVF/PQ; None = all. Vectors are added
    in ``add_batch_size`` batches from memory-mapped shards. ``device="gpu"`` (IVF indexes): k-means
    runs on all GPUs and vectors are added to an index sharded over them (returned on GPU;
    `save_index` copies it back); flat and HNSW indexes are built on CPU. Without GPU support this
    warns and builds on CPU.
    """
    opts = BuildOptions.of(options, **settings)
    check_build_options(opts)  # every config value checked before the shards are read
    start = time.perf_counter()
    shards = list_shards(embeddings_dir)
    info = embeddings_info(shards)
    count, dim = info["count"], info["dim"]
    if count == 0:
        raise ValueError(f"{embeddings_dir}: the embeddings hold no passages")
    train_count = _train_count(count, opts.train_sample)
    factory = resolve_factory(opts.factory, dim, count, train_count, nlist=opts.nlist, m=opts.m)
    index = _empty_index(factory, dim, opts)
    log.info("building %s (%s) over %d passages × %d dims", factory, opts.metric, count, dim)
    if not index.is_trained:
        _train(index, shards, opts, count, train_count)
    index = _placed(index, factory, opts.device)
    with tqdm(total=count, desc="index add", unit="psg", unit_scale=True) as bar:
        for batch in iter_batches(shards, opts.add_batch_size):
            index.add(batch)
            bar.update(len(batch))
    set_search_params(index, nprobe=opts.nprobe, ef_search=opts.ef_search)
    ids = _row_ids(shards, index)
    log.info("built %s over %d passages in %.1f s", factory, index.ntotal, time.perf_counter() - start)
    return index, ids


def _empty_index(factory: str, dim: int, opts: BuildOptions) -> faiss.Index:
    """The untrained, empty index of the (filled) ``factory`` string."""
    index = faiss.index_factory(dim, factory, METRICS[opts.metric])
    # index_factory turns on polysemous training for PQ: a simulated-annealing pass (16 s for 800
    # vectors here) that only pays off for Hamming-filtered search, which we never use.
    for inner in (faiss.downcast_index(index), faiss.try_extract_index_ivf(index)):
        if getattr(inner, "do_polysemous_training", False):
            inner.do_polysemous_training = False
    if opts.ef_construction is not None and hasattr(index, "hnsw"):
        index.hnsw.efConstruction = int(opts.ef_construction)
    return index


def _train(index: faiss.Index, shards: list, opts: BuildOptions, count: int, train_count: int) -> None:
    """Train IVF/PQ on ``train_count`` rows drawn uniformly with ``opts.seed`` (k-means on GPUs with device=gpu)."""
    rows = np.sort(np.random.default_rng(opts.seed).choice(count, size=train_count, replace=False))
    sample = gather_rows(shards, rows)
    ivf = faiss.try_extract_index_ivf(index) if opts.device == "gpu" else None
    if ivf is not None:
        clustering = gpu.gpu_clustering_index(index.d, METRICS[opts.metric])
        if clustering is not None:
            ivf.clustering_index = clustering  # k-means on GPUs; the rest of training stays on CPU
    t0 = time.perf_counter()
    index.train(sample)
    log.info("trained on %d vectors in %.1f s", train_count, time.perf_counter() - t0)
    del sample
    if opts.device == "gpu" and ivf is not None:
        ivf.clustering_index = None  # faiss holds a raw pointer: drop it before the GPU copy is freed


def _placed(index: faiss.Index, factory: str, device: str) -> faiss.Index:
    """Where the vectors are added: an IVF index with device=gpu moves to the GPUs (sharded), all else stays."""
    if device == "gpu":
        if faiss.try_extract_index_ivf(index) is not None:
            # IVF adds are compute (list assignment + encoding): do them on GPUs, sharded. Ids stay global
            # row numbers: faiss shards IVF indexes with explicit sequential ids.
            return gpu.to_gpus(index, shard=True)
        # a sharded GPU flat index accepts a single add() only, and adding to a flat index is a copy
        # anyway; load_index(device="gpu") moves it to the GPUs for search
        log.info("%s is built on CPU; load it with device=gpu to search on GPUs", factory)
    return index


def _row_ids(shards: list, index: faiss.Index) -> list[str]:
    """The passage id of each of the index's rows, in shard order; one per vector added."""
    ids: list[str] = []
    for shard in shards:
        ids.extend(shard.ids())
    if len(ids) != index.ntotal:
        raise RuntimeError(f"index holds {index.ntotal} vectors but the shards list {len(ids)} ids")
    return ids


def bytes_per_passage(index: faiss.Index) -> float:
    """Serialized index size / passages (in-memory serialization: for benchmarks and small indexes)."""
    cpu_index = gpu.to_cpu(index)
    return len(faiss.serialize_index(cpu_index)) / max(cpu_index.ntotal, 1)
