"""``inspect`` settings: the thresholds above which a finding is a WARNING (one source of defaults;
``conf/data_inspect.yaml`` selects this dataclass as ``inspect/default``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from dpr.config import strict_from_dict


@dataclass
class InspectConfig:
    # Shares of the training questions / mined negatives / passages above which training is likely to fail.
    no_negatives_max: float = 0.10     # questions without any negative while train.hard_negatives > 0
    no_positives_max: float = 0.10     # questions without a positive (the trainer skips them)
    false_negative_max: float = 0.01   # mined negatives that contain the answer or are judged relevant
    truncated_max: float = 0.05        # questions / passages longer than the model's max length
    teacher_min_separation: float = 0.6  # share of (positive, negative) pairs the teacher ranks right
    max_passages: int = 20000          # passages tokenized for the length figures (a seeded sample beyond)
    max_questions: int = 20000
    seed: int = 0
    bins: int = 30                     # histogram bins in the plot and the margin histogram

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "InspectConfig":
        return strict_from_dict(cls, dict(d or {}), "inspect")
