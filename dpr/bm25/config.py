"""The BM25 index's settings: one dataclass, the one source of their defaults for ``dpr-bm25``, ``dpr-pipeline``
(its ``bm25`` section) and Python callers of `dpr.bm25.build_index`.

Registered in Hydra's ConfigStore as the ``bm25_cfg/default`` option: ``conf/bm25.yaml`` places it at the root
(``bm25_cfg@_global_``: ``dpr-bm25 k1=1.2``), ``conf/pipeline.yaml`` under ``bm25`` (``dpr-pipeline bm25.k1=1.2``).
Types and ranges are checked by the commands' schemas (`dpr.cli.schemas`) and by `dpr.bm25.index.index_params`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dpr.config import register_defaults

# bm25s' scoring variant (Lucene's idf); fixed: it is not a setting, but an index records it
METHOD = "lucene"


@dataclass
class BM25Config:
    # pyserini's settings for its DPR Wikipedia runs (k1 = 0.9, b = 0.4)
    k1: float = 0.9                   # term-frequency saturation (0: term frequency ignored)
    b: float = 0.4                    # share of length normalisation, in [0, 1]
    stopwords: Any = "en"             # en | none | any bm25s language name
    stemmer: Optional[str] = "english"  # a PyStemmer (Snowball) algorithm, or none


def register_schema() -> None:
    """``bm25_cfg/default``: BM25Config's defaults, for conf/bm25.yaml and conf/pipeline.yaml to select."""
    register_defaults("bm25_cfg", "default", BM25Config)
