"""``train.rounds``: how many times ``dpr-pipeline`` trains (re-mining rounds, `dpr.pipeline.train_model_rounds`).

The key is the pipeline's, not the trainer's: `TrainConfig` (one run, what ``dpr-train`` and :func:`train` take)
has no ``rounds``, and the pipeline strips it (`split_rounds`) before it hands the section to :func:`train`.
Users still write ``train.rounds=N`` because a round count reads as a training setting; the section gains the
key through `PipelineTrainConfig`, merged by conf/pipeline.yaml after the ``train`` group (`register_schema`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from dpr.config import Int
from dpr.training.config import TrainConfig

ROUNDS_RANGE = Int(1)


@dataclass
class PipelineTrainConfig(TrainConfig):
    """The pipeline's ``train`` section: TrainConfig's keys plus the number of rounds."""

    rounds: int = 1   # 1: train once; N: then N - 1 times more, each on negatives re-mined by the last model


def split_rounds(train: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """``(rounds, the other keys)`` of a pipeline ``train`` section: the count checked (one line naming
    ``train.rounds``), the rest what :func:`train` takes."""
    keys = dict(train)
    rounds = keys.pop("rounds", PipelineTrainConfig.rounds)
    if not ROUNDS_RANGE.allows(rounds):
        raise ValueError(f"train.rounds must be {ROUNDS_RANGE.describe()}, got {rounds!r}")
    return int(rounds), keys


def register_schema() -> None:
    """``train_rounds/default``: `PipelineTrainConfig` with every key of TrainConfig MISSING, for conf/pipeline.yaml
    to merge after the ``train`` group (``train_rounds@train``). Why this shape: OmegaConf retypes a section merged
    with a subclass of its type, so the section gains a typed ``rounds`` (``train.rounds=x`` is refused when
    composed), while MISSING values leave the chosen preset's (``train=long``) as they are; ``dpr-train`` never
    selects it, so ``dpr-train train.rounds=2`` stays an unknown key."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import MISSING, OmegaConf

    node = OmegaConf.structured(PipelineTrainConfig)
    for f in dataclasses.fields(TrainConfig):
        node[f.name] = MISSING
    ConfigStore.instance().store(group="train_rounds", name="default", node=node)
