"""Warnings while training, for the two ways a run goes wrong without failing (the peers' trackers are full
of both): negatives too easy to teach anything, and training that makes the model worse than it started.

Each is logged once per run by the main rank, with what to try; nothing stops the run. The thresholds are
module constants (read at call time, so a test or a user can change them in-process):

- :data:`EASY_STEPS` steps in a row with in-batch accuracy 1.0 and loss below :data:`EASY_LOSS`;
- a dev validation after the first full epoch worse than the starting weights' (``train.validate_at_start``
  gives the start; without it there is nothing to compare).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

EASY_STEPS = 50      # steps in a row
EASY_LOSS = 0.01     # below this (nats) with accuracy 1.0: the negatives teach nothing


@dataclass
class HealthWatch:
    """Per-run state of the warnings (streak of easy steps, what was already said)."""

    enabled: bool = True          # the main rank only
    streak: int = 0
    warned: set = field(default_factory=set)

    def after_step(self, step: int, loss: float, accuracy: float) -> str | None:
        """The warning for negatives that are too easy, the first time the streak reaches :data:`EASY_STEPS`."""
        self.streak = self.streak + 1 if accuracy >= 1.0 and loss < EASY_LOSS else 0
        if self.streak < EASY_STEPS or "easy" in self.warned:
            return None
        return self._say("easy", (
            f"WARNING: step {step}: in-batch accuracy 1.0 with loss < {EASY_LOSS} for {self.streak} steps in a row: "
            "the negatives are too easy to teach anything. Try harder negatives (dpr-bm25 mine=true, "
            "train.hard_negatives, train.rounds / dense re-mining), a larger train.batch_size, or a lower "
            "model.temperature."))

    def after_validation(self, step: int, epoch: int, metric: str, value: float, start: float | None,
                         greater_is_better: bool) -> str | None:
        """The warning for a dev metric still worse than the start once an epoch is done."""
        if start is None or epoch < 1 or "worse" in self.warned:
            return None
        worse = value < start if greater_is_better else value > start
        if not worse:
            return None
        return self._say("worse", (
            f"WARNING: step {step} (epoch {epoch}): dev {metric} {value:.4g} is still worse than the starting "
            f"weights' {start:.4g}: training is making the model worse. Try a lower train.lr, more "
            "train.warmup_ratio, fewer or frozen passage layers (train.passage_frozen_layers), or check the "
            "data (dpr-data inspect) for false negatives; the best weights kept are the start's while this lasts."))

    def _say(self, key: str, message: str) -> str:
        self.warned.add(key)
        if self.enabled:
            log.warning("%s", message)
        return message
