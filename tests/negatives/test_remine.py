"""Dense re-mining: the filters drop exactly what they should, and the mix keeps both sources."""

from __future__ import annotations

import pytest

from dpr.negatives.dense import mix_negatives
from dpr.negatives.filters import select_negatives


CANDS = [("pos", 0.90), ("judged", 0.88), ("ans", 0.87), ("close", 0.86), ("n1", 0.80), ("n2", 0.70),
         ("n3", 0.60), ("n4", 0.50)]


def test_mined_negatives_never_hold_positives_judged_or_answer_bearing():
    kept, counts = select_negatives(CANDS, 0.9, positives={"pos"}, judged={"judged"},
                                    contains_answer=lambda pid: pid == "ans", num_negatives=10, relative_margin=0.0)
    assert kept == ["close", "n1", "n2", "n3", "n4"]
    assert counts["rejected_positive"] == counts["rejected_judged"] == counts["rejected_answer"] == 1
    assert counts["kept"] == 5 and counts["examined"] == 8


@pytest.mark.parametrize("margin", [0.0, 0.02, 0.05, 0.1, 0.2, 0.5])
def test_margin_filter_drops_exactly_the_candidates_above_its_threshold(margin):
    pos = 0.9
    threshold = pos - margin * abs(pos)
    kept, counts = select_negatives(CANDS, pos, positives={"pos"}, judged=(), contains_answer=None,
                                    num_negatives=100, relative_margin=margin)
    expected = [pid for pid, s in CANDS if pid != "pos" and not (margin > 0 and s > threshold)]
    assert kept == expected
    assert counts["rejected_margin"] == sum(1 for pid, s in CANDS if pid != "pos" and margin > 0 and s > threshold)


def test_skip_top_and_negative_positive_scores():
    kept, counts = select_negatives([("a", -1.0), ("b", -1.2), ("c", -3.0)], -2.0, positives=set(),
                                    num_negatives=5, skip_top=1, relative_margin=0.5)
    # threshold = -2 - 0.5 * 2 = -3: "b" (-1.2) is above it, "a" is in the skipped top rank
    assert kept == ["c"] and counts["rejected_top"] == 1 and counts["rejected_margin"] == 1


def test_mix_keeps_the_share_and_tops_up():
    bm25 = [{"passage_id": f"b{i}"} for i in range(5)]
    dense = [{"passage_id": f"d{i}"} for i in range(5)] + [{"passage_id": "b0"}]
    got = [c["passage_id"] for c in mix_negatives(bm25, dense, 4, 0.5)]
    assert got == ["b0", "b1", "d0", "d1"]
    got = [c["passage_id"] for c in mix_negatives(bm25, dense[:1], 4, 0.25)]
    assert got == ["b0", "d0", "b1", "b2"]  # dense ran short: topped up from BM25
