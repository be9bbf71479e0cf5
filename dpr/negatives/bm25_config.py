"""How deep BM25 retrieves and how its hard negatives are mined: the one source of these defaults for ``dpr-bm25``
(the keys at its root), ``dpr-pipeline`` (its ``bm25`` section, beside the index's `dpr.bm25.config.BM25Config`)
and the miner `dpr.negatives.bm25`.

Registered in Hydra's ConfigStore (`register_schema`) as ``bm25_mine_cfg/default`` (every field: conf/bm25.yaml
places it at the root) and ``bm25_mine_cfg/pipeline`` (the `PIPELINE_KEYS`: conf/pipeline.yaml places them under
``bm25``). Whether to mine (``mine``) is each command's own choice, written in its YAML: dpr-bm25 retrieves unless
told to mine, the pipeline mines unless told not to. The fields carry their ranges (``ranged``):
the commands' schemas (`dpr.cli.schemas`) are generated from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpr.checks import MAX_K
from dpr.config import ranged, register_defaults


@dataclass
class BM25MiningConfig:
    k: int = ranged(100, 1, MAX_K)  # passages per question in BM25's results (the pipeline also mines from these top k)
    num_negatives: int = ranged(30, 1, MAX_K)  # hard negatives kept per training question
    depth: int = ranged(100, 1, MAX_K)  # how deep in BM25's ranking to look for negatives (dpr-bm25; the pipeline's is k)


# The keys of the pipeline's ``bm25`` section: its BM25 stages' recorded parameters (with BM25Config's and
# ``mine``), so a key added there would change their fingerprints and re-run cached stages; it mines to depth k.
PIPELINE_KEYS = ("k", "num_negatives")


def register_schema() -> None:
    """``bm25_mine_cfg/default`` (every field) and ``bm25_mine_cfg/pipeline`` (`PIPELINE_KEYS`): BM25MiningConfig's
    defaults, for conf/bm25.yaml and conf/pipeline.yaml to select."""
    register_defaults("bm25_mine_cfg", "default", BM25MiningConfig)
    register_defaults("bm25_mine_cfg", "pipeline", BM25MiningConfig, keys=PIPELINE_KEYS)
