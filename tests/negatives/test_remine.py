"""Dense re-mining: the filters drop exactly what they should, and the mix keeps both sources."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

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


def test_interleave_alternates_the_sources_and_keeps_the_default_order_otherwise():
    bm25 = [{"passage_id": f"b{i}"} for i in range(5)]
    dense = [{"passage_id": "b0"}] + [{"passage_id": f"d{i}"} for i in range(5)]
    # the prefix a teacher scores (its first 3) holds re-mined negatives: dense, BM25, dense, ...
    got = [c["passage_id"] for c in mix_negatives(bm25, dense, 6, 0.5, interleave=True)]
    # dense's first is b0 (also BM25's): it fills the first (dense) place once, and BM25's turn takes b1
    assert got == ["b0", "b1", "d0", "b2", "d1", "b3"]
    got = [c["passage_id"] for c in mix_negatives(bm25[:1], dense[1:], 4, 0.5, interleave=True)]
    assert got == ["d0", "b0", "d1", "d2"]  # BM25 ran short: topped up from dense
    # the same set as the default order wherever both sources last; the default order is unchanged
    plain = mix_negatives(bm25, dense[1:], 4, 0.5)
    assert [c["passage_id"] for c in plain] == ["b0", "b1", "d0", "d1"]
    assert sorted(c["passage_id"] for c in mix_negatives(bm25, dense[1:], 4, 0.5, interleave=True)) == \
        sorted(c["passage_id"] for c in plain)


@given(n_bm25=st.integers(0, 12), n_dense=st.integers(0, 12), overlap=st.integers(0, 4), n=st.integers(0, 12),
       share=st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]))
def test_interleaved_prefixes_keep_the_share(n_bm25, n_dense, overlap, n, share):
    bm25 = [{"passage_id": f"b{i}"} for i in range(n_bm25)]
    dense = [{"passage_id": f"b{i}"} for i in range(min(overlap, n_bm25))] + \
        [{"passage_id": f"d{i}"} for i in range(n_dense)]
    got = [c["passage_id"] for c in mix_negatives(bm25, dense, n, share, interleave=True)]
    pool = {c["passage_id"] for c in bm25 + dense}
    assert len(got) == len(set(got)) == min(n, len(pool)) and set(got) <= pool
    if overlap:
        return
    # while both sources still have unseen passages, each prefix of m holds ceil(share * m - 0.5) of BM25's
    for m in range(1, len(got) + 1):
        prefix = got[:m]
        bm25_left = any(c["passage_id"] not in prefix for c in bm25)
        dense_left = any(c["passage_id"] not in prefix and c["passage_id"].startswith("d") for c in dense)
        if not (bm25_left and dense_left):
            break
        assert sum(pid.startswith("b") for pid in prefix) == math.ceil(share * m - 0.5)
