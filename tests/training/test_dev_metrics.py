"""Dev metrics as objects (dpr/training/dev_metrics.py): the built-ins give the numbers the validation gave
before they were objects, a registered metric is reported, selectable and compared the way it says."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from dpr.training import dev_metrics as dm
from dpr.training.config import TrainConfig
from dpr.training.dev_metrics import DevMetric, DevRankings, evaluate, greater_is_better, register_metric
from dpr.training.validation import DevEncoding, Validator, average_rank, corpus_topk_accuracy


@pytest.fixture()
def registry(monkeypatch):
    """A copy of the registry for the test to register into, undone after it."""
    monkeypatch.setattr(dm, "_REGISTRY", dict(dm._REGISTRY))
    return dm._REGISTRY


def _old_ci95(values: torch.Tensor) -> float:  # validation._ci95 as it was
    n = values.numel()
    return float(1.96 * values.double().std(unbiased=True) / n ** 0.5) if n > 1 else float("nan")


def test_pool_metrics_are_the_old_average_rank_and_mrr():
    ranks = torch.tensor([0, 2, 1, 5], dtype=torch.float64)
    got = evaluate([dm.AVG_RANK, dm.MRR], DevRankings([{}] * 4, pool_ranks=ranks))
    rr = 1.0 / (ranks + 1)
    assert got == {"avg_rank": float(ranks.mean()), "avg_rank_ci95": _old_ci95(ranks),
                   "mrr": float(rr.mean()), "mrr_ci95": _old_ci95(rr)}
    assert list(got) == ["avg_rank", "avg_rank_ci95", "mrr", "mrr_ci95"]
    assert got["avg_rank"] == 2.0 and got["mrr"] == pytest.approx((1 + 1 / 3 + 1 / 2 + 1 / 6) / 4)


def test_topk_is_the_old_first_hit_column():
    hits = torch.tensor([[False, True, False], [False, False, False], [True, False, True]])
    rankings = DevRankings([{}] * 3, corpus_ranking=[["a", "b", "c"]] * 3, corpus_hits=hits)
    got = evaluate([dm.topk_metric(k) for k in (1, 2, 3, 20)], rankings)
    kmax = hits.shape[1]
    first_hit = hits.cumsum(dim=1) > 0  # the old computation
    for k in (1, 2, 3, 20):
        col = first_hit[:, min(k, kmax) - 1].double()
        assert got[f"top{k}"] == float(col.mean()) and got[f"top{k}_ci95"] == _old_ci95(col)
    assert (got["top1"], got["top2"], got["top20"]) == pytest.approx((1 / 3, 2 / 3, 2 / 3))
    assert dm.topk_metric(5).depth == 5 and dm.topk_metric(5).needs_corpus and greater_is_better("top5")


def test_ndcg10_is_the_old_graded_ndcg():
    from dpr.eval.qrels_metrics import query_metrics

    examples = [{"positive_ctxs": [{"passage_id": "a"}], "qrels": {"a": 2, "c": 1}},
                {"positive_ctxs": [{"passage_id": "c"}]}]  # no qrels: its positive, grade 1
    ranking = [["b", "c", "a"], ["a", "b", "c"]]
    got = evaluate([dm.NDCG10], DevRankings(examples, corpus_ranking=ranking,
                                            corpus_hits=torch.zeros(2, 3, dtype=torch.bool), graded=True))
    old = torch.zeros(2, dtype=torch.float64)
    for i, (ranked, ex) in enumerate(zip(ranking, examples)):
        judged = ex.get("qrels") or {c["passage_id"]: 1 for c in ex["positive_ctxs"]}
        old[i] = query_metrics(ranked[:10], judged, ["ndcg@10"])["ndcg@10"]
    assert got == {"ndcg@10": float(old.mean()), "ndcg@10_ci95": _old_ci95(old)}
    ndcg1 = (1 / math.log2(3) + 2 / math.log2(4)) / (2 + 1 / math.log2(3))
    assert got["ndcg@10"] == pytest.approx((ndcg1 + 1 / math.log2(4)) / 2)
    assert dm.NDCG10.qrels_only and not dm.NDCG10.applies(corpus=True, graded=False)


def test_greater_is_better_reads_the_registry_then_the_name_rule(registry):
    assert not greater_is_better("avg_rank") and greater_is_better("mrr") and greater_is_better("ndcg@10")
    assert greater_is_better("top7")  # any k of train.val_topk
    assert not greater_is_better("loss") and not greater_is_better("val_rank") and greater_is_better("accuracy")
    register_metric(DevMetric("misses", False, lambda r: (r.pool_ranks > 0).double()))
    register_metric(DevMetric("rank_agreement", True, lambda r: r.pool_ranks))
    assert not greater_is_better("misses") and greater_is_better("rank_agreement")  # the object, not the name


def test_a_lower_is_better_metric_keeps_the_lowest(registry):
    register_metric(DevMetric("misses", False, lambda r: (r.pool_ranks > 0).double()))
    v = Validator(None, [], corpus=None, use_answers=True, cfg={}, encoding=DevEncoding(8, 8),
                  primary_metric="misses")
    assert not v.greater_is_better
    best = None
    for value in [0.5, 0.75, 0.25, float("nan"), 0.25, 0.5]:
        if v.is_better("misses", value, best):
            best = value
    assert best == 0.25  # the lowest; NaN never; a tie does not replace the first


def test_register_refuses_what_the_validation_could_not_tell_apart(registry):
    per_q = lambda r: r.pool_ranks  # noqa: E731
    for name in ("auto", "top3", "mrr_ci95", "num_questions", ""):
        with pytest.raises(ValueError, match="taken or malformed"):
            register_metric(DevMetric(name, True, per_q))
    with pytest.raises(ValueError, match="'mrr' is already registered"):
        register_metric(DevMetric("mrr", True, per_q))
    with pytest.raises(ValueError, match="give its depth"):
        register_metric(DevMetric("deep", True, per_q, needs_corpus=True))
    register_metric(DevMetric("mrr", True, per_q), replace=True)
    with pytest.raises(ValueError, match="gave \\(2,\\) values for 3 dev questions"):
        evaluate([DevMetric("short", True, lambda r: [1.0, 2.0])], DevRankings([{}] * 3))


def test_train_config_and_validator_accept_a_registered_metric(registry):
    with pytest.raises(ValueError, match="best_metric='misses' is not a dev metric; one of auto, avg_rank, mrr, "
                                         "top1, top5, top20, ndcg@10 \\(top<k>"):
        TrainConfig.from_dict({"best_metric": "misses"})
    register_metric(DevMetric("misses", False, lambda r: (r.pool_ranks > 0).double()))
    register_metric(DevMetric("recall@3", True, lambda r: r.corpus_hits[:, :3].any(dim=1).double(),
                              needs_corpus=True, depth=3))
    register_metric(DevMetric("judged@3", True, lambda r: r.corpus_hits[:, :3].any(dim=1).double(),
                              needs_corpus=True, depth=3, qrels_only=True))
    assert dm.metric_names([1, 5]) == ["avg_rank", "mrr", "misses", "top1", "top5", "ndcg@10", "recall@3", "judged@3"]
    assert TrainConfig.from_dict({"best_metric": "misses", "val_corpus_topk": False}).best_metric_for("qa") == "misses"
    with pytest.raises(ValueError, match="best_metric=recall@3 needs train.val_corpus_topk=true"):
        TrainConfig.from_dict({"best_metric": "recall@3", "val_corpus_topk": False})
    with pytest.raises(ValueError, match="best_metric=judged@3 needs qrels data"):
        TrainConfig.from_dict({"best_metric": "judged@3"}).best_metric_for("qa")
    assert TrainConfig.from_dict({"best_metric": "judged@3"}).best_metric_for("qrels") == "judged@3"
    dev = [{"question": "q", "answers": ["a"], "positive_ctxs": [{"passage_id": "p"}]}]
    kw = dict(use_answers=True, cfg={"val_topk": [1]}, encoding=DevEncoding(8, 8))
    assert Validator(None, dev, corpus=None, primary_metric="misses", **kw)
    with pytest.raises(ValueError, match="best_metric='recall@3'.*computes avg_rank, mrr, misses "):
        Validator(None, dev, corpus=None, primary_metric="recall@3", **kw)


def _dev():
    return [{"question": f"q{i}", "answers": [], "positive_ctxs": [{"passage_id": f"p{i}", "title": "", "text": ""}],
             "hard_negative_ctxs": [], "negative_ctxs": []} for i in range(3)]


def test_a_registered_metric_is_reported_after_the_built_ins(registry):
    register_metric(DevMetric("misses", False, lambda r: (r.pool_ranks > 0).double()))
    register_metric(DevMetric("hit_at_depth", True, lambda r: r.corpus_hits[:, :2].any(dim=1).double(),
                              needs_corpus=True, depth=2))
    dot = SimpleNamespace(similarity=lambda q, p: q @ p.T)
    ids = ["p0", "p1", "p2"]
    q = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.5, 1.0], [0.0, 0.0, 1.0]])  # q1 ranks p2, then its p1
    pool = average_rank(dot, None, _dev(), question_vectors=q, known_passages=(ids, torch.eye(3)))
    assert list(pool) == ["avg_rank", "avg_rank_ci95", "mrr", "mrr_ci95", "misses", "misses_ci95",
                          "rank_pool_size", "num_questions"]
    assert pool["misses"] == pytest.approx(1 / 3) and pool["avg_rank"] == pytest.approx(1 / 3)
    top = corpus_topk_accuracy(dot, None, _dev(), (ids, ["", "", ""], ["", "", ""]), ks=[1], use_answers=False,
                               question_vectors=q, passage_vectors=torch.eye(3))
    assert list(top) == ["top1", "top1_ci95", "ndcg@10", "ndcg@10_ci95", "hit_at_depth", "hit_at_depth_ci95"]
    assert top["top1"] == pytest.approx(2 / 3) and top["hit_at_depth"] == 1.0  # p1 is q1's second
