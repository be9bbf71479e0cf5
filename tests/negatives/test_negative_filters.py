"""The one false-negative filter (dpr.negatives.filters) and the Retriever-based miner (dpr.negatives.mine):
each caller's answer rule (title or not) is the one it states, and BM25 mining is mining through a retriever."""

from __future__ import annotations

import pytest

from dpr import bm25
from dpr.data.dataset import DatasetPaths
from dpr.data.retriever_json import read_retriever_json
from dpr.negatives import bm25 as bm25_negatives
from dpr.negatives.filters import answer_check, false_negative, rejection, select_negatives
from dpr.negatives.mine import mine_examples
from dpr.retrieval import BM25Retriever

PASSAGES = {"t": {"title": "Honolulu", "text": "A city on Oahu."}, "x": {"title": "", "text": "Honolulu, Hawaii."},
            "n": {"title": "Paris", "text": "A city in France."}}


def test_check_title_is_what_separates_the_miners_from_the_masks_rule():
    with_title = answer_check(["Honolulu"], PASSAGES.__getitem__, check_title=True)
    text_only = answer_check(["Honolulu"], PASSAGES.__getitem__, check_title=False)
    assert [with_title(p) for p in "txn"] == [True, True, False]
    assert [text_only(p) for p in "txn"] == [False, True, False]
    assert answer_check([], PASSAGES.__getitem__, check_title=True) is None  # qrels data: nothing to check


def test_reasons_come_in_the_filters_order():
    contains = answer_check(["Honolulu"], PASSAGES.__getitem__, check_title=True)
    # a positive that also holds the answer is counted as a positive, the first rule
    assert rejection("x", positives={"x"}, contains_answer=contains) == "rejected_positive"
    assert rejection("n", positives=set(), judged={"n"}) == "rejected_judged"
    assert rejection("t", 5, positives=set(), contains_answer=contains, skip_top=9) == "rejected_answer"
    assert rejection("n", 5, positives=set(), contains_answer=contains, skip_top=9) == "rejected_top"
    assert rejection("n", 9, 1.0, positives=set(), skip_top=9, threshold=0.5) == "rejected_margin"
    assert rejection("n", 9, 0.5, positives=set(), skip_top=9, threshold=0.5) is None
    ctx = {"passage_id": "t", **PASSAGES["t"]}
    assert false_negative(ctx, relevant=(), answers=["Honolulu"], check_title=True) == "rejected_answer"
    assert false_negative(ctx, relevant=(), answers=["Honolulu"], check_title=False) is None
    assert false_negative(ctx, relevant={"t"}, answers=[], check_title=False) == "rejected_positive"


def test_margin_needs_the_positive_score_and_no_cap_keeps_all():
    with pytest.raises(ValueError, match="positive's score"):
        select_negatives([("a", 1.0)], positives=set(), relative_margin=0.1)
    kept, counts = select_negatives([(f"p{i}", 1.0) for i in range(40)], positives={"p3"}, num_negatives=None)
    assert len(kept) == 39 and counts["examined"] == 40 and counts["rejected_positive"] == 1


def test_bm25_mining_is_mine_examples_over_a_bm25_retriever(tiny_data_dir):
    ds = DatasetPaths(tiny_data_dir / "tiny")
    index = bm25.build_index(ds.passages)
    examples = read_retriever_json(ds.train)
    mined, stats = bm25_negatives.mine_hard_negatives(index, examples, ds.passages, num_negatives=3, depth=8)
    again, counts = mine_examples(BM25Retriever(index, ds.passages), examples, num_negatives=3, depth=8,
                                  end_at_score=0.0)
    assert again == mined and stats == {k: counts[k] for k in stats}
    assert stats["kept"] > 0 and all(c["score"] > 0 for ex in mined for c in ex["hard_negative_ctxs"])
    # without the zero-score end, BM25's padding (passages sharing no term) would be kept as well
    padded, _ = mine_examples(BM25Retriever(index, ds.passages), examples, num_negatives=3, depth=8)
    assert sum(len(ex["hard_negative_ctxs"]) for ex in padded) > stats["kept"]


def test_a_retriever_without_passages_is_refused_before_searching(tiny_data_dir):
    index = bm25.build_index(tiny_data_dir / "tiny" / "passages.tsv")
    with pytest.raises(ValueError, match="needs its passages"):
        mine_examples(BM25Retriever(index), [{"question": "q", "positive_ctxs": []}])
