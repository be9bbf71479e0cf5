"""Training-time warnings (dpr.training.health): negatives too easy, training that makes dev worse."""

from __future__ import annotations

import logging

import pytest

from dpr.training import health
from dpr.training.health import HealthWatch
from dpr.training.train import train
from tests.training.test_trainer import tiny_cfg

pytestmark = pytest.mark.usefixtures("one_thread")


def test_easy_negatives_warn_once_after_a_streak(monkeypatch):
    monkeypatch.setattr(health, "EASY_STEPS", 3)
    w = HealthWatch(enabled=False)
    said = [w.after_step(s, 0.001, 1.0) for s in (1, 2)]
    said.append(w.after_step(3, 0.5, 1.0))       # the streak breaks on a real loss
    said += [w.after_step(s, 0.001, 1.0) for s in (4, 5, 6, 7, 8)]
    assert said[:5] == [None] * 5 and said[5].startswith("WARNING: step 6:") and "too easy" in said[5]
    assert said[6:] == [None, None]              # said once
    assert HealthWatch(enabled=False).after_step(1, 0.001, 0.9) is None


@pytest.mark.parametrize("greater,value,warns", [(True, 0.4, True), (True, 0.6, False), (False, 3.0, True),
                                                 (False, 1.0, False)])
def test_worse_than_start_after_an_epoch(greater, value, warns):
    start = 0.5 if greater else 2.0
    w = HealthWatch(enabled=False)
    assert w.after_validation(5, 0, "m", value, start, greater) is None      # within the first epoch: no finding
    assert w.after_validation(9, 1, "m", value, None, greater) is None       # no start to compare with
    said = w.after_validation(10, 1, "m", value, start, greater)
    assert (said is not None) == warns
    if warns:
        assert "still worse than the starting weights'" in said
        assert w.after_validation(20, 2, "m", value, start, greater) is None  # once


def test_the_trainer_logs_both_warnings(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch, caplog):
    """The loop hands every step's loss and accuracy, and every validation with the start's value, to the
    watch. Thresholds no real run meets (any loss counts as easy; the start is made to look better than
    every later validation) make the tiny run show both warnings, each once."""
    monkeypatch.setattr(health, "EASY_STEPS", 2)
    monkeypatch.setattr(health, "EASY_LOSS", float("inf"))
    seen = []
    orig_step, orig_val = HealthWatch.after_step, HealthWatch.after_validation

    def step(self, s, loss, acc):
        seen.append(("step", s))
        return orig_step(self, s, loss, 1.0)

    def val(self, s, epoch, metric, value, start, greater):
        seen.append(("val", s, epoch, start))
        better_start = None if start is None else (value + 1 if greater else value - 1)
        return orig_val(self, s, epoch, metric, value, better_start, greater)

    monkeypatch.setattr(HealthWatch, "after_step", step)
    monkeypatch.setattr(HealthWatch, "after_validation", val)
    caplog.set_level(logging.WARNING, logger="dpr.training.health")
    train(tiny_cfg(tiny_model_dir, tiny_data_dir, tmp_path / "run", max_steps=4, validate_at_start=True,
                   precision="fp32"))
    assert [x for x in seen if x[0] == "step"] == [("step", s) for s in (1, 2, 3, 4)]
    vals = [x for x in seen if x[0] == "val"]
    assert vals[0][1] == 0 and vals[0][3] is None      # the start itself compares with nothing
    assert all(x[3] is not None for x in vals[1:]) and any(x[2] >= 1 for x in vals[1:])
    assert caplog.text.count("too easy") == 1
    assert caplog.text.count("still worse than the starting weights'") == 1
