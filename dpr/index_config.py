"""The FAISS index's build settings: one dataclass, the one source of their defaults and ranges for ``dpr-index``,
``dpr-pipeline`` (its ``index`` section) and Python callers of `dpr.index.build_index`.

``conf/index/{flat,hnsw,ivfpq}.yaml`` set some keys; a key they leave out takes the default here. The commands'
schema (`dpr.cli.schemas.IndexSchema`) is generated from these fields, and `dpr.index.build.check_build_options`
reads the same ranges, so a range is written once. A module of its own, outside `dpr.index`, so that the commands'
schemas read it without importing faiss (as `dpr.encode_config` is to `dpr.encode`).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Optional

from dpr.checks import INT32_MAX, SEED_MAX
from dpr.config import ranged, with_overrides

@dataclass(frozen=True)
class BuildOptions:
    """How `build_index` builds an index: the ``index`` section of ``dpr-index`` and ``dpr-pipeline``. Checked by
    `dpr.index.build.check_build_options` before any shard is read. 0 is refused where null means auto: faiss reads
    0 lists or a 0-wide beam as "return nothing", and HNSW0 aborts the process."""

    factory: str = "Flat"  # a faiss factory string (dpr.index.factory); {nlist} and {m} filled from the data
    metric: str = "ip"  # ip | l2 (cosine models store unit vectors, so ip = cosine)
    # vectors (uniform, seeded) that train IVF/PQ
    train_sample: Optional[int] = ranged(262_144, 1, INT32_MAX, note="null = every vector")
    add_batch_size: int = ranged(65_536, 1, INT32_MAX)  # vectors per add() call, read from the memory-mapped shards
    device: str = "cpu"  # cpu | gpu (IVF: k-means and adds on every GPU; flat and HNSW are built on CPU)
    nlist: Optional[int] = ranged(None, 1, INT32_MAX, note="null = about 4*sqrt(N)")  # IVF lists
    # PQ sub-quantizers (must divide the dimension)
    m: Optional[int] = ranged(None, 1, INT32_MAX, note="null = largest divisor of dim <= dim/8")
    ef_construction: Optional[int] = ranged(None, 1, INT32_MAX, note="null = faiss's 40")  # HNSW build beam
    # HNSW search beam saved in the index
    ef_search: Optional[int] = ranged(None, 1, INT32_MAX, note="null = faiss's 16 / as saved")
    # IVF lists searched, saved in the index
    nprobe: Optional[int] = ranged(None, 1, INT32_MAX, note="null = faiss's 1 / as saved")
    seed: int = ranged(0, 0, SEED_MAX)  # the training sample's seed

    @classmethod
    def of(cls, options: "BuildOptions | None" = None, **settings: Any) -> "BuildOptions":
        """``options`` (the defaults when None) with the keyword ``settings`` replaced, each one of its fields
        (`dpr.config.with_overrides`: a TypeError naming any other and the fields)."""
        return with_overrides(options or cls(), settings, "build_index()")


def field_range(name: str) -> tuple[Any, bool]:
    """The declared range (`dpr.config.Range`) of BuildOptions' field ``name`` (None for a field without one), and
    whether its type allows null."""
    rng = {f.name: f.metadata.get("range") for f in dataclasses.fields(BuildOptions)}[name]
    return rng, type(None) in typing.get_args(typing.get_type_hints(BuildOptions)[name])


RANGED_FIELDS = tuple(f.name for f in dataclasses.fields(BuildOptions) if "range" in f.metadata)
