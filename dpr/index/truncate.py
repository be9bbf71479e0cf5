"""Truncated embeddings: a finished `dpr-encode` directory cut to its vectors' first ``d`` coordinates, no re-encode.

The pipeline's ``dense.dims`` (`dpr.encode_config.DenseConfig`) makes a system ``dense@<d>`` per size from the trained
model's ``dense/embeddings``: `truncate_embeddings` writes the same shards (ids, ranges, fingerprints of the model and
the passages) with each vector cut by `dpr.models.truncate.truncate` (the prefix, re-normalised where the shards are
normalised: the rule of ``encode.dim``, so these shards equal an encode at ``dim=d`` up to float16 rounding). The
manifests record ``dim`` (d), ``truncate_dim`` (d), ``model_dim`` (the model's full size) and ``truncated_from``.
The whole directory is written aside and renamed into place (`dpr.atomic.atomic_path`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from dpr.atomic import atomic_path
from dpr.index.shards import ShardFiles, commit_shard, list_shards, write_ids
from dpr.models.truncate import check_dim, truncate

log = logging.getLogger(__name__)

# Manifest keys of the source that describe its encoding run, not these vectors' file: not copied.
_NOT_COPIED = ("format", "seconds", "passages_per_second", "dim")
_BLOCK = 65_536  # rows truncated at once


def _owned(path: Path) -> bool:
    """An existing output is replaced only when it is an embeddings directory (shard files only)."""
    return all(p.name.startswith("shard_") for p in path.iterdir())


def _write_cut(vectors: np.ndarray, path: Path, dim: int, normalize: bool) -> None:
    """``vectors`` (memory-mapped) truncated into a new ``.npy`` at ``path``, a block of rows at a time (memory
    stays at one block however big the shard)."""
    count = vectors.shape[0]
    if not count:  # numpy cannot memory-map 0 bytes
        with open(path, "wb") as f:
            np.save(f, np.zeros((0, dim), dtype=vectors.dtype))
        return
    out = np.lib.format.open_memmap(path, mode="w+", dtype=vectors.dtype, shape=(count, dim))
    for a in range(0, count, _BLOCK):
        block = torch.from_numpy(np.asarray(vectors[a:a + _BLOCK], dtype=np.float32))
        out[a:a + _BLOCK] = truncate(block, dim, normalize).numpy().astype(vectors.dtype)
    out.flush()
    del out


def truncate_embeddings(source: str | Path, output: str | Path, dim: int) -> Path:
    """Write ``source``'s shards with each vector truncated to ``dim`` coordinates into ``output`` (module doc).
    ``dim`` must be smaller than the source's size (ValueError naming both otherwise); returns ``output``."""
    source, output = Path(source), Path(output)
    shards = list_shards(source)
    full = int(shards[0].manifest["dim"])
    if check_dim(dim, full, f"the embeddings {source}", key="dense.dims") is None:
        raise ValueError(f"dense.dims: {dim} is the full size of the embeddings {source}: nothing to truncate")
    t0 = time.perf_counter()
    with atomic_path(output, owned=_owned) as tmp:
        tmp.mkdir(parents=True)
        for shard in shards:
            m = shard.manifest
            files = ShardFiles(tmp, shard.files.stem)
            tmp_vectors, tmp_ids = tmp / f".{files.stem}.npy.tmp", tmp / f".{files.stem}.ids.txt.tmp"
            _write_cut(shard.vectors(), tmp_vectors, dim, bool(m.get("normalized", False)))
            write_ids(tmp_ids, shard.ids())
            manifest = {**{k: v for k, v in m.items() if k not in _NOT_COPIED}, "dim": dim, "truncate_dim": dim,
                        "model_dim": int(m.get("model_dim", full)), "truncated_from": str(source.resolve())}
            commit_shard(files, tmp_vectors, tmp_ids, manifest)
    log.info("%s: %d shard(s) truncated %d → %d dims in %.1f s", output, len(shards), full, dim,
             time.perf_counter() - t0)
    return output
