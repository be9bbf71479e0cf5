"""The BM25 index's settings: one dataclass, the one source of their defaults for ``dpr-bm25``, ``dpr-pipeline``
(its ``bm25`` section) and Python callers of `dpr.bm25.build_index`.

How an index is built and searched, which changes no index and no ranking, is two more dataclasses, keys at the
root of ``dpr-bm25`` (``bm25_build_cfg/default``, ``bm25_search_cfg/default``): ``shard_passages`` (`BM25BuildConfig`)
and ``n_threads`` (`BM25SearchConfig`).

Registered in Hydra's ConfigStore as the ``bm25_cfg/default`` option: ``conf/bm25.yaml`` places it at the root
(``bm25_cfg@_global_``: ``dpr-bm25 k1=1.2``), ``conf/pipeline.yaml`` under ``bm25`` (``dpr-pipeline bm25.k1=1.2``).
The fields carry their ranges (``ranged``): the commands' schemas (`dpr.cli.schemas`) are generated from them;
`dpr.bm25.index.index_params` checks them again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from dpr.checks import INT32_MAX, MAX_K1, MAX_THREADS
from dpr.config import ranged, register_defaults

# bm25s' scoring variant (Lucene's idf); fixed: it is not a setting, but an index records it
METHOD = "lucene"


@dataclass
class BM25Config:
    # pyserini's settings for its DPR Wikipedia runs (k1 = 0.9, b = 0.4)
    k1: float = ranged(0.9, 0.0, MAX_K1)  # term-frequency saturation (0: term frequency ignored)
    b: float = ranged(0.4, 0.0, 1.0)  # share of length normalisation
    stopwords: Any = "en"             # en | none | any bm25s language name
    stemmer: Optional[str] = "english"  # a PyStemmer (Snowball) algorithm, or none


@dataclass
class BM25BuildConfig:
    # How the index is built, not what it holds: not among the index's settings (BM25Config), so it changes no
    # index's key and no recorded stage. ~1.5 GB of build memory per million passages of a shard; a corpus of
    # at most this many passages is one shard, bm25s' own layout.
    shard_passages: int = ranged(500_000, 1, INT32_MAX)  # passages per shard of a sharded build


@dataclass
class BM25SearchConfig:
    # threads of retrieval and mining: the same ranking on any number of them, so no recorded stage changes with it
    n_threads: int = ranged(0, -1, MAX_THREADS, note="0 = the calling thread, -1 = all cores")


def index_settings(section: Mapping[str, Any] | None) -> dict[str, Any]:
    """The index's settings (BM25Config's fields) of a ``bm25`` config section, BM25Config's defaults where it lacks
    them; the section's other keys (the pipeline's mining depths) are not the index's. What every builder of a
    dataset's cached index passes (the pipeline's BM25 stages, the BM25 teacher): one index, one set of settings."""
    given = dict(section or {})
    return {f.name: given.get(f.name, getattr(BM25Config(), f.name)) for f in dataclasses.fields(BM25Config)}


def register_schema() -> None:
    """``bm25_cfg/default``: BM25Config's defaults, for conf/bm25.yaml and conf/pipeline.yaml to select; and
    ``bm25_build_cfg/default``, ``bm25_search_cfg/default`` (BM25BuildConfig's, BM25SearchConfig's) for
    conf/bm25.yaml."""
    register_defaults("bm25_cfg", "default", BM25Config)
    register_defaults("bm25_build_cfg", "default", BM25BuildConfig)
    register_defaults("bm25_search_cfg", "default", BM25SearchConfig)
