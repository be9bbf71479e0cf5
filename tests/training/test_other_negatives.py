"""``train.other_negatives``: a question's ``negative_ctxs`` join its hard-negative draw only while it is null/true;
false draws from ``hard_negative_ctxs`` alone (DPR's NQ recipe, other_negatives: 0). Null is recorded nowhere."""

from __future__ import annotations

import dataclasses

from dpr.training.batching import make_item, mined_negatives, warn_topped_up
from dpr.training.config import TrainConfig, without_unset
from tests.training.helpers import train_batches


def _ctx(pid: str) -> dict:
    return {"passage_id": pid, "title": "", "text": f"text {pid}"}


def _ex(i: int) -> dict:
    return {"question": f"q{i}", "answers": [], "positive_ctxs": [_ctx(f"p{i}")],
            "hard_negative_ctxs": [_ctx(f"h{i}")], "negative_ctxs": [_ctx(f"n{i}.{k}") for k in range(6)]}


def test_negative_ctxs_join_the_draw_only_when_the_key_says_so():
    ex = _ex(0)
    drawn_with = {c["passage_id"] for e in range(20) for c in make_item(ex, 0, e, 1, 1).passages[1:]}
    assert any(pid.startswith("n") for pid in drawn_with)  # as always: negative_ctxs are drawn too
    drawn_without = {c["passage_id"] for e in range(20)
                     for c in make_item(ex, 0, e, 1, 1, other_negatives=False).passages[1:]}
    assert drawn_without == {"h0"}
    assert [c["passage_id"] for c in mined_negatives(ex, other_negatives=False)] == ["h0"]


def test_the_batches_follow_the_config_key_and_null_keeps_todays_draw():
    examples = [_ex(i) for i in range(12)]
    base = dict(batch_size=2, hard_negatives=1, seed=4)
    today = train_batches(examples, None, **base)
    assert TrainConfig().other_negatives is None
    explicit = train_batches(examples, None, other_negatives=True, **base)
    off = train_batches(examples, None, other_negatives=False, **base)
    n = today.num_batches(0)
    assert [today.items(0, b) for b in range(n)] == [explicit.items(0, b) for b in range(n)]
    negs = {c["passage_id"] for b in range(n) for it in off.items(0, b) for c in it.passages[1:]}
    assert negs and all(pid.startswith("h") for pid in negs)


def test_short_questions_are_counted_without_negative_ctxs_when_off(caplog):
    examples = [_ex(i) for i in range(4)]
    assert warn_topped_up(examples, 2) == 0
    assert warn_topped_up(examples, 2, other_negatives=False) == 4


def test_null_is_not_recorded_in_fingerprints_and_false_is():
    default = dataclasses.asdict(TrainConfig())
    assert "other_negatives" not in without_unset(default, "cpu")
    assert without_unset({**default, "other_negatives": False}, "cpu")["other_negatives"] is False
    assert TrainConfig.from_dict({"other_negatives": False}).other_negatives is False
