"""What `dpr-pipeline` does differently on a large corpus or a GPU machine: the ``scale`` section.

``scale.untrained``: the untrained-model baseline (the ``dense_untrained`` system: the starting weights encode,
index and search the whole corpus, reported beside the trained model). ``auto`` keeps it for corpora of at most
``scale.untrained_max_passages`` passages and drops it above (at 21M passages it is a whole extra corpus encode
and index for a reference row).

``scale.index_device``: where the dense systems' retrieval searches (`dpr.index.load_index`'s ``device``): ``auto``
is ``gpu`` where CUDA is available (faiss-gpu when installed, else an exact torch search of the flat index's
memory-mapped shards sharded over the GPUs, `dpr.index.shard_search`), else ``cpu``. It does not enter the
retrieval stages' recorded parameters: the same index gives the same ranking (up to float rounding) on either.

``scale.large_index_above``: a flat ``index`` searched on the CPU over more passages than this is replaced by the
compressed index `large_index_params` describes: ``IVF1024,PQ<dim/4>`` probed exhaustively (nprobe 1024), the
configuration docs/results/scale.md measured within 1.5 top-20 points of flat at 1M passages (−1.3) at 7% of its
memory (106 bytes a passage at 384 dims against 1,536). Below the size, and for any other ``index`` choice, the
``index`` section is used as given, so every smaller run keeps its stages' parameters.

Registered as ``scale_cfg/default`` (conf/pipeline.yaml places it under ``scale``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpr.checks import INT32_MAX
from dpr.config import ranged, register_defaults

log = logging.getLogger(__name__)

UNTRAINED = ("auto", True, False)
INDEX_DEVICES = ("auto", "cpu", "gpu")


@dataclass
class ScaleConfig:
    # the untrained-model baseline (dense_untrained): auto (on up to untrained_max_passages) | true | false
    untrained: Any = "auto"
    # the largest corpus (passages) for which untrained=auto keeps the baseline
    untrained_max_passages: int = ranged(1_000_000, 1, INT32_MAX)
    # where retrieval searches the dense indexes: auto (gpu where CUDA is available) | cpu | gpu
    index_device: str = "auto"
    # above this many passages a flat index searched on the CPU becomes IVF1024,PQ<dim/4>, nprobe 1024
    large_index_above: int = ranged(2_000_000, 1, INT32_MAX)

    def check(self) -> "ScaleConfig":
        """Each key one of its values (one line naming it otherwise); returns self."""
        if self.untrained not in UNTRAINED or isinstance(self.untrained, int) and not isinstance(self.untrained,
                                                                                                bool):
            raise ValueError(f"scale.untrained must be auto, true or false, got {self.untrained!r}")
        if self.index_device not in INDEX_DEVICES:
            raise ValueError(f"scale.index_device must be one of {', '.join(INDEX_DEVICES)}, got {self.index_device!r}")
        for key in ("untrained_max_passages", "large_index_above"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"scale.{key} must be a positive integer, got {value!r}")
        return self

    def keeps_untrained(self, passages: int) -> bool:
        """Whether the untrained-model baseline runs for a corpus of ``passages``."""
        if self.untrained == "auto":
            keep = passages <= self.untrained_max_passages
            if not keep:
                log.info("scale.untrained=auto: no untrained-model baseline for %d passages (> %d); "
                         "scale.untrained=true runs it", passages, self.untrained_max_passages)
            return keep
        return bool(self.untrained)

    def search_device(self) -> str:
        """``cpu`` or ``gpu``: ``index_device`` with ``auto`` resolved on this machine."""
        if self.index_device != "auto":
            return self.index_device
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"


def large_index_params(dim: int, count: int, section: dict) -> dict:
    """The compressed index that replaces a flat one above ``large_index_above``: IVF1024,PQm with m the largest
    divisor of ``dim`` up to dim/4 (96 at 384 dims, 192 at 768), every list probed (fewer lists where ``count``
    cannot train 1024: 39 vectors each); ``section``'s metric, add batch and device kept."""
    from dpr.index.build import MIN_POINTS_PER_CENTROID

    target = max(1, dim // 4)
    m = max(d for d in range(1, target + 1) if dim % d == 0)
    train = min(count, 131_072)
    nlist = max(1, min(1024, train // MIN_POINTS_PER_CENTROID))
    keep = {k: section[k] for k in ("metric", "device", "add_batch_size") if k in section}
    return {"factory": "IVF{nlist},PQ{m}", "nlist": nlist, "m": m, "nprobe": nlist, "train_sample": train,
            "seed": 0, **keep}


def index_params(section: dict, scale: ScaleConfig, embeddings: Path) -> dict:
    """The ``index`` stage's parameters for ``embeddings``: ``section`` itself, except a flat index searched on the
    CPU over more than ``scale.large_index_above`` passages (`large_index_params`, said in the log)."""
    if str(section.get("factory", "")).strip() != "Flat" or scale.search_device() != "cpu":
        return section
    from dpr.index.shards import embeddings_info, list_shards

    info = embeddings_info(list_shards(embeddings))
    if info["count"] <= scale.large_index_above:
        return section
    params = large_index_params(int(info["dim"]), int(info["count"]), section)
    log.info("%d passages > scale.large_index_above=%d: %s (nprobe %d) instead of a flat index searched on the "
             "CPU (index=<other> or scale.large_index_above keeps another choice)", info["count"],
             scale.large_index_above, params["factory"], params["nprobe"])
    return params


def register_schema() -> None:
    """``scale_cfg/default``: ScaleConfig's defaults, for conf/pipeline.yaml's ``scale`` section."""
    register_defaults("scale_cfg", "default", ScaleConfig)
