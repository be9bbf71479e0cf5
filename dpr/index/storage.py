"""Saving and loading an index: ``<path>`` (faiss), ``<path>.ids`` (passage ids) and ``<path>.json`` (metadata).

The three are one output. Each is written aside and renamed (ids, then index, then metadata), so no file is ever
half-written; the metadata, moved in last, names the other two (``files``: size and a fingerprint of each), and
`load_index` refuses an index whose files are not the ones its metadata names: a build killed between the moves
(or a file copied in from another build) leaves new ids beside an old index, or a new index beside old metadata,
which would otherwise search with exit 0 and return the wrong passages. An index saved before the metadata named
its files loads as before (its ids and vectors must agree in number).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import faiss

from dpr.atomic import atomic_path, write_json_atomic
from dpr.errors import DataError
from dpr.index import gpu
from dpr.index.build import build_index, check_search_params, planned_factory, set_search_params
from dpr.index.shards import IdList, embeddings_info, list_shards, write_ids

log = logging.getLogger(__name__)


def ids_path(path: str | Path) -> Path:
    return Path(str(path) + ".ids")


def meta_path(path: str | Path) -> Path:
    return Path(str(path) + ".json")


_BLOCK, _BLOCKS = 1 << 12, 64  # a file's fingerprint: its size, first and last 64 KiB and 64 blocks between


def file_fingerprint(path: str | Path) -> dict:
    """``{"bytes", "sampled_sha256"}`` of ``path``: sha256 over its size, its first and last 64 KiB and 64 blocks
    spread between. Reads at most ~400 KiB of any file (a many-GB index loads memory-mapped); two builds' indexes
    differ in every block of vectors, so a file of another build is told apart."""
    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= 2 * (1 << 16) + _BLOCKS * _BLOCK:
            h.update(f.read())
        else:
            offsets = [0, *(size * i // (_BLOCKS + 1) for i in range(1, _BLOCKS + 1)), size - (1 << 16)]
            for i, off in enumerate(offsets):
                f.seek(off)
                h.update(f.read(1 << 16 if i in (0, len(offsets) - 1) else _BLOCK))
    return {"bytes": size, "sampled_sha256": h.hexdigest()}


def check_index_files(path: str | Path, meta: dict) -> None:
    """Raise :class:`DataError` (one line) when the index or its ids are not the files ``meta`` names."""
    files = meta.get("files")
    if not isinstance(files, dict):
        return  # saved before the metadata named its files
    for role, file in (("index", Path(path)), ("ids", ids_path(path))):
        if files.get(role) != file_fingerprint(file):
            raise DataError(file, f"not the {role} file {meta_path(path).name} names (files of two builds: one was "
                            "interrupted or a file was copied in); build the index again with dpr-index", field="files")


def save_index(index: faiss.Index, ids: list[str], path: str | Path, meta: dict | None = None) -> int:
    """Write the index (copied to CPU if it lives on GPUs) and its ids; returns the index file size."""
    path = Path(path)
    cpu_index = gpu.to_cpu(index)
    if cpu_index.ntotal != len(ids):
        raise ValueError(f"index holds {cpu_index.ntotal} vectors but {len(ids)} ids were given")
    with atomic_path(ids_path(path)) as tmp:
        write_ids(tmp, ids)
    meta = {**(meta or {}), "count": int(cpu_index.ntotal), "dim": int(cpu_index.d),
            "metric": "ip" if cpu_index.metric_type == faiss.METRIC_INNER_PRODUCT else "l2"}
    with atomic_path(path) as tmp:
        faiss.write_index(cpu_index, str(tmp))
        size = tmp.stat().st_size
    meta["bytes"] = size
    meta["bytes_per_passage"] = round(size / max(cpu_index.ntotal, 1), 2)
    meta["files"] = {"index": file_fingerprint(path), "ids": file_fingerprint(ids_path(path))}
    write_json_atomic(meta_path(path), meta)  # last: until it is in place, the files are not its files
    log.info("saved %s: %d passages, %.1f bytes/passage", path, cpu_index.ntotal, meta["bytes_per_passage"])
    return size


def read_index_meta(path: str | Path) -> dict:
    """The metadata written beside an index, or {} for an index built elsewhere."""
    try:
        return json.loads(meta_path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def load_index(path: str | Path, device: str = "cpu", nprobe: int | None = None,
               ef_search: int | None = None, mmap: bool = False,
               search_dtype: str = "float32") -> tuple[faiss.Index, list[str]]:
    """Read an index and its ids; ``device="gpu"`` shards it over all visible GPUs (CPU fallback; a flat
    index without faiss-gpu: exact search in torch, vectors in ``search_dtype``, `dpr.index.gpu.to_gpus`).

    ``mmap=True`` memory-maps the index file (large flat/IVF indexes on CPU: pages load on demand).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"index not found: {path}")
    if not ids_path(path).is_file():
        raise FileNotFoundError(f"index ids not found: {ids_path(path)} (written by save_index beside the index)")
    if device == "gpu":  # a flat index without faiss-gpu: its shards searched in place on the GPUs, no host copy
        from dpr.index.shard_search import from_shards

        if (found := from_shards(path, read_index_meta(path), ids_path(path), search_dtype)) is not None:
            return found
    check_index_files(path, read_index_meta(path))
    flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
    index = faiss.read_index(str(path), flags)
    ids = IdList.read(ids_path(path))  # one buffer, not a Python string per passage
    if len(ids) != index.ntotal:
        raise DataError(ids_path(path), f"{len(ids)} ids for an index of {index.ntotal} vectors")
    check_search_params(nprobe=nprobe, ef_search=ef_search)
    # on the CPU copy, before any GPU copy: a saved value given again here is replaced, not refused
    check_saved_search_params(index, path, nprobe=nprobe, ef_search=ef_search)
    if device == "gpu":
        index = gpu.to_gpus(index, shard=True, torch_dtype=search_dtype)
    elif device != "cpu":
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    set_search_params(index, nprobe=nprobe, ef_search=ef_search)
    return index, ids


def saved_search_params(index: faiss.Index) -> dict[str, int]:
    """The query-time knobs a CPU index holds (``nprobe`` of IVF, ``ef_search`` of HNSW) as faiss stores them."""
    out: dict[str, int] = {}
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        out["nprobe"] = int(ivf.nprobe)
    inner = faiss.downcast_index(index)
    if hasattr(inner, "hnsw"):
        out["ef_search"] = int(inner.hnsw.efSearch)
    return out


def check_saved_search_params(index: faiss.Index, path: str | Path, **overrides: int | None) -> None:
    """An index saved with ``ef_search``/``nprobe`` < 1 (written before they were checked) would return fewer
    than k passages per question, or none: refused unless overridden, naming the override that fixes it."""
    for key, value in saved_search_params(index).items():
        if value < 1 and overrides.get(key) is None:
            raise DataError(path, f"the index holds {key}={value} (saved before it was checked; faiss would return "
                            f"fewer than k passages): give {key}=<n >= 1> to search it", field=key)


def build_and_save(embeddings_dir: str | Path, output: str | Path, **params: Any) -> dict:
    """`build_index` + `save_index`; returns (and logs) count, dim, factory, build seconds, bytes/passage."""
    start = time.perf_counter()
    index, ids = build_index(embeddings_dir, **params)
    seconds = time.perf_counter() - start
    info = embeddings_info(list_shards(embeddings_dir))
    meta = {
        "factory": planned_factory(embeddings_dir, **params),
        "embeddings": str(Path(embeddings_dir).resolve()),
        "model": info["model"],
        "model_fingerprint": info["model_fingerprint"],
        "passages_sha256": info["passages_sha256"],
        "normalized": info["normalized"],
        # truncated vectors (dpr.index.truncate, encode.dim): the question side is cut to "dim" the same way
        **{k: info[k] for k in ("truncate_dim", "model_dim") if k in info},
        "build_seconds": round(seconds, 2),
        "params": {k: v for k, v in params.items() if isinstance(v, (str, int, float, bool, type(None)))},
    }
    save_index(index, ids, output, meta)
    meta = read_index_meta(output)
    log.info("index %s: %d passages, built in %.1f s, %.1f bytes/passage", output, meta["count"],
             seconds, meta["bytes_per_passage"])
    return meta
