"""A training file without mined negatives is said in one warning (rank 0 only), not trained on in silence:
`make_item` tops each question's hard negatives up at random from the pool."""

from __future__ import annotations

from tests.training.helpers import train_batches


def _examples(mined: int) -> list[dict]:
    ctx = lambda pid: {"passage_id": pid, "title": "", "text": f"text {pid}"}  # noqa: E731
    return [{"question": f"q{i}", "answers": [], "positive_ctxs": [ctx(f"p{i}")], "negative_ctxs": [],
             "hard_negative_ctxs": [ctx(f"h{i}_{j}") for j in range(mined)]} for i in range(6)]


def test_unmined_examples_are_warned_about_once_on_rank_zero(caplog):
    kw = dict(batch_size=2, question_max_length=8, passage_max_length=8, seed=0)
    with caplog.at_level("WARNING", logger="dpr.training.batching"):
        train_batches(_examples(1), None, hard_negatives=1, **kw)
        train_batches(_examples(0), None, hard_negatives=0, **kw)  # no hard negatives asked for
        assert not caplog.records
        train_batches(_examples(0), None, hard_negatives=1, rank=1, world_size=2, **kw)
        assert not caplog.records
        train_batches(_examples(0), None, hard_negatives=1, **kw)
    assert len(caplog.records) == 1
    assert "6 of 6 training questions have fewer than 1 mined negatives (6 have none)" in caplog.text
    assert "dpr-bm25 mine=true" in caplog.text
