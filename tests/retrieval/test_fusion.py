"""Hybrid fusion arithmetic on hand-made rankings (expected orders and scores computed by hand)."""

from __future__ import annotations

import pytest

from dpr.errors import DataError
from dpr.retrieval.fusion import fuse_linear, fuse_rrf, fuse_runs_linear, fuse_runs_rrf, normalize_scores, tune_linear_weight


def ctx(pid, score, has_answer=False):
    return {"id": pid, "title": f"T{pid}", "text": f"text {pid}", "score": score, "has_answer": has_answer}


def result(question, ctxs):
    return {"question": question, "answers": ["x"], "ctxs": ctxs}


# BM25 a=10 b=6 c=2 → min-max a=1, b=.5, c=0.  Dense b=1 d=.75 a=.5 → b=1, d=.5, a=0
# (binary fractions, so ties below are exact ties).
# d is missing from BM25 → 0 there; c is missing from dense → 0 there.
BM25 = [result("q", [ctx("a", 10.0, True), ctx("b", 6.0), ctx("c", 2.0)])]
DENSE = [result("q", [ctx("b", 1.0), ctx("d", 0.75), ctx("a", 0.5, True)])]


def order_scores(fused):
    return [c["id"] for c in fused[0]["ctxs"]], [c["score"] for c in fused[0]["ctxs"]]


def test_minmax_normalisation():
    assert normalize_scores([10, 6, 2]).tolist() == [1.0, 0.5, 0.0]
    assert normalize_scores([3, 3]).tolist() == [0.0, 0.0]
    assert normalize_scores([3, 1], "none").tolist() == [3.0, 1.0]
    with pytest.raises(ValueError):
        normalize_scores([1.0], "zscore")


@pytest.mark.parametrize(
    "weight, order, scores",
    [
        # b = 1 + .5w, d = .5, a = w, c = 0
        (0.0, ["b", "d", "a", "c"], [1.0, 0.5, 0.0, 0.0]),  # a/c tie at 0: a has a dense rank, c none
        (0.5, ["b", "d", "a", "c"], [1.25, 0.5, 0.5, 0.0]),  # d/a tie: d ranks 2nd in dense, a 3rd
        (1.0, ["b", "a", "d", "c"], [1.5, 1.0, 0.5, 0.0]),
        (2.0, ["b", "a", "d", "c"], [2.0, 2.0, 0.5, 0.0]),  # b/a tie: b is dense's first
        (3.0, ["a", "b", "d", "c"], [3.0, 2.5, 0.5, 0.0]),
    ],
)
def test_linear_fusion_minmax(weight, order, scores):
    fused = fuse_linear(BM25, DENSE, weight, k=10)
    got_order, got_scores = order_scores(fused)
    assert got_order == order
    assert got_scores == pytest.approx(scores)
    # passage fields and has_answer survive fusion; question/answers come through
    by_id = {c["id"]: c for c in fused[0]["ctxs"]}
    assert by_id["a"]["has_answer"] is True and by_id["c"]["title"] == "Tc" and by_id["d"]["text"] == "text d"
    assert fused[0]["question"] == "q" and fused[0]["answers"] == ["x"]


def test_linear_fusion_raw_scores_and_k():
    # raw: missing BM25 = 2 (its min), missing dense = .5; w=.25:
    # a = .5 + 2.5 = 3.0, b = 1 + 1.5 = 2.5, d = .75 + .5 = 1.25, c = .5 + .5 = 1.0
    fused = fuse_linear(BM25, DENSE, 0.25, k=3, normalize="none")
    got_order, got_scores = order_scores(fused)
    assert got_order == ["a", "b", "d"]
    assert got_scores == pytest.approx([3.0, 2.5, 1.25])


def test_rrf():
    # ranks: BM25 a1 b2 c3, dense b1 d2 a3
    fused = fuse_rrf(BM25, DENSE, k=10, k_rrf=60)
    got_order, got_scores = order_scores(fused)
    assert got_order == ["b", "a", "d", "c"]
    assert got_scores == pytest.approx([1 / 62 + 1 / 61, 1 / 61 + 1 / 63, 1 / 62, 1 / 63])
    fused = fuse_rrf(BM25, DENSE, k=2, k_rrf=1)
    assert order_scores(fused) == (["b", "a"], pytest.approx([1 / 3 + 1 / 2, 1 / 2 + 1 / 4]))


def test_misaligned_questions_rejected():
    with pytest.raises(DataError, match="question 0"):
        fuse_linear(BM25, [result("other", [])], 1.0)
    with pytest.raises(DataError):
        fuse_rrf(BM25, DENSE + DENSE)


def test_tune_weight_picks_best_and_smallest_on_ties():
    # q1 (answer a): top-1 is a iff w > 2 (a = w vs b = 1 + .5w).
    # q2: BM25 y=5 x=1 → y=1 x=0; dense x=.8 y=.2 → x=1 y=0; answer x: top-1 iff w <= 1 (tie → dense's x).
    q2_bm25 = result("q2", [ctx("y", 5.0), ctx("x", 1.0, True)])
    q2_dense = result("q2", [ctx("x", 0.8, True), ctx("y", 0.2)])
    grid = [4.0, 0.0, 0.5, 1.0, 2.0, 3.0]
    weight, table = tune_linear_weight(BM25 + [q2_bm25], DENSE + [q2_dense], grid=grid, metric_k=1,
                                       metric="topk")
    values = {row["weight"]: row["value"] for row in table}
    assert values == {0.0: 0.5, 0.5: 0.5, 1.0: 0.5, 2.0: 0.0, 3.0: 0.5, 4.0: 0.5}
    assert weight == 0.0  # all-way tie → the smallest weight
    # a second question like q1 tips the balance to large weights: 3 and 4 tie → 3
    q3_bm25, q3_dense = dict(BM25[0], question="q3"), dict(DENSE[0], question="q3")
    weight, table = tune_linear_weight(BM25 + [q2_bm25, q3_bm25], DENSE + [q2_dense, q3_dense], grid=grid,
                                       metric_k=1, metric="topk")
    assert weight == 3.0
    assert [row["metric"] for row in table] == ["top1"] * len(grid)
    # with k=2, a is in the top 2 for w >= 1 and x for all w: every weight >= 1 gets both questions
    weight, _ = tune_linear_weight(BM25 + [q2_bm25], DENSE + [q2_dense], grid=grid, metric_k=2, metric="topk")
    assert weight == 1.0


def test_tune_weight_by_mrr():
    # same questions as above, at k=2: q1's answer a ranks 1st for w > 2, 2nd for 1 <= w <= 2, below 2 otherwise;
    # q2's x ranks 1st for w <= 1, else 2nd. MRR@2 = mean of 1/rank (0 outside the top 2).
    q2_bm25 = result("q2", [ctx("y", 5.0), ctx("x", 1.0, True)])
    q2_dense = result("q2", [ctx("x", 0.8, True), ctx("y", 0.2)])
    grid = [4.0, 0.0, 0.5, 1.0, 2.0, 3.0]
    weight, table = tune_linear_weight(BM25 + [q2_bm25], DENSE + [q2_dense], grid=grid, metric_k=2, metric="mrr")
    assert {row["weight"]: row["value"] for row in table} == {0.0: 0.5, 0.5: 0.5, 1.0: 0.75, 2.0: 0.5, 3.0: 0.75,
                                                              4.0: 0.75}
    assert weight == 1.0 and table[0]["metric"] == "mrr@2"
    with pytest.raises(ValueError, match="metric"):
        tune_linear_weight(BM25, DENSE, grid=grid, metric="ndcg")


def test_trec_runs_fuse_and_tune():
    bm25 = {"q1": {"a": 10.0, "b": 6.0, "c": 2.0}, "q2": {"y": 5.0, "x": 1.0}}
    dense = {"q1": {"b": 1.0, "d": 0.75, "a": 0.5}, "q2": {"x": 0.8, "y": 0.2}}
    fused = fuse_runs_linear(bm25, dense, 3.0, k=10)
    assert list(fused["q1"]) == ["a", "b", "d", "c"]
    assert list(fused["q1"].values()) == pytest.approx([3.0, 2.5, 0.5, 0.0])
    assert list(fused["q2"]) == ["y", "x"]  # y = 3, x = 1
    rrf = fuse_runs_rrf(bm25, dense, k=10)
    assert list(rrf["q1"]) == ["b", "a", "d", "c"]
    qrels = {"q1": {"a": 1, "c": 0}, "q2": {"x": 2}, "q3": {"z": 0}}  # q3 has no relevant doc: skipped
    weight, table = tune_linear_weight(bm25, dense, grid=[0.0, 3.0], metric_k=1, qrels=qrels,
                                       metric="topk")
    assert [row["value"] for row in table] == [0.5, 0.5] and weight == 0.0
    assert table[0]["metric"] == "recall@1"
    with pytest.raises(ValueError, match="qrels"):
        tune_linear_weight(bm25, dense, grid=[0.0])
    with pytest.raises(ValueError, match="same format"):
        fuse_linear(BM25, dense, 1.0)
