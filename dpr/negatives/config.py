"""The re-mining settings of ``dpr-pipeline … train.rounds=N`` (`dpr.negatives.dense`): one dataclass, the one
source of their defaults.

Registered in Hydra's ConfigStore as the ``remine_cfg/default`` option, which ``conf/pipeline.yaml`` places under
``remine`` (``dpr-pipeline train.rounds=2 remine.depth=100``). They were once ``train.remine_*`` keys:
only the pipeline reads them (``dpr-train`` trains one round), so they left `TrainConfig` and its checkpoints.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from dpr.config import Int, Real, check_fields, register_defaults, setting, strict_from_dict


@dataclass
class RemineConfig:
    negatives: int = setting(30, Int(1))  # mined negatives kept per question
    depth: int = setting(200, Int(1))  # how deep in the trained model's ranking to look
    skip_top: int = setting(0, Int(0))  # skip the top ranks (FlagEmbedding mines ranks 2-200)
    # drop candidates scoring above (1 - margin) x the positive's score
    relative_margin: float = setting(0.05, Real(0, note="0: no margin filter"))
    bm25_share: float = setting(0.5, Real(0, 1))  # share of the new negative lists that stays BM25's

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "RemineConfig":
        """Build and check (ranges, then ``skip_top < depth``); one line naming the first bad key."""
        rc = strict_from_dict(cls, dict(d or {}), "remine")
        check_fields(rc, "remine")
        if rc.skip_top >= rc.depth:
            raise ValueError(f"remine.skip_top={rc.skip_top} must be < remine.depth={rc.depth} "
                             "(nothing would be left to mine)")
        return rc

    def as_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `dpr.negatives.dense.remine_dataset`."""
        return {"num_negatives": self.negatives, "depth": self.depth, "skip_top": self.skip_top,
                "relative_margin": self.relative_margin, "bm25_share": self.bm25_share}


def moved_from_train() -> dict[str, str]:
    """``train.remine_<key>`` (once a TrainConfig key) → ``remine.<key>``: the commands refuse the old
    override naming the new key (Hydra alone would only call it unknown)."""
    return {f"train.remine_{f.name}": f"remine.{f.name}" for f in dataclasses.fields(RemineConfig)}


def register_schema() -> None:
    """``remine_cfg/default``: RemineConfig's defaults, for conf/pipeline.yaml to select (``remine_cfg@remine``)."""
    register_defaults("remine_cfg", "default", RemineConfig)
