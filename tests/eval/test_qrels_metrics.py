"""Qrels metrics equal pytrec_eval's (trec_eval's) values, on hand-made, random and real BM25 runs."""

from __future__ import annotations

import json
import math
import random

import pytest

from dpr.eval.qrels_metrics import mean_metrics, per_query_metrics, rank_documents

pytrec_eval = pytest.importorskip("pytrec_eval")

PAIRS = [("ndcg@10", "ndcg_cut_10"), ("recall@10", "recall_10"), ("recall@100", "recall_100")]


def pytrec_values(run, qrels):
    """pytrec_eval per query; MRR@10 as recip_rank over the run cut to its top 10 (trec_eval order)."""
    full = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut_10", "recall_10", "recall_100"}).evaluate(run)
    top10 = {q: {d: docs[d] for d in rank_documents(docs)[:10]} for q, docs in run.items()}
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    return {q: {"ndcg@10": full[q]["ndcg_cut_10"], "recall@10": full[q]["recall_10"],
                "recall@100": full[q]["recall_100"], "mrr@10": rr[q]["recip_rank"]} for q in full}


def assert_equal_to_pytrec(run, qrels):
    expected = pytrec_values(run, qrels)
    qids, ours = per_query_metrics(run, qrels)
    assert set(expected) <= set(qids)
    for i, q in enumerate(qids):
        for metric in ("ndcg@10", "mrr@10", "recall@10", "recall@100"):
            assert ours[metric][i] == pytest.approx(expected[q][metric], abs=1e-9), (q, metric)
    return expected


def test_hand_computed():
    qrels = {"q": {"d1": 2, "d2": 1, "d3": 0, "d9": 1}}
    run = {"q": {"d3": 5.0, "d1": 4.0, "d7": 3.0, "d2": 2.0}}
    m = mean_metrics(run, qrels)
    assert m["mrr@10"] == pytest.approx(1 / 2)  # d3 is judged but not relevant
    assert m["recall@10"] == pytest.approx(2 / 3)  # d1, d2 of {d1, d2, d9}
    dcg = 2 / math.log2(3) + 1 / math.log2(5)
    idcg = 2 / 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert m["ndcg@10"] == pytest.approx(dcg / idcg)
    assert_equal_to_pytrec(run, qrels)


def test_ties_broken_like_trec_eval():
    # equal scores: trec_eval ranks by document id, descending
    assert rank_documents({"a": 1.0, "c": 1.0, "b": 2.0}) == ["b", "c", "a"]
    assert_equal_to_pytrec({"q": {"a": 1.0, "c": 1.0}}, {"q": {"a": 1}})


def test_random_runs_with_ties_and_grades():
    rnd = random.Random(0)
    qrels, run = {}, {}
    for q in range(60):
        qid = f"q{q}"
        qrels[qid] = {f"d{rnd.randint(0, 80)}": rnd.choice([0, 1, 2, 3]) for _ in range(rnd.randint(1, 20))}
        run[qid] = {f"d{rnd.randint(0, 80)}": float(rnd.randint(0, 6)) for _ in range(rnd.randint(1, 150))}
    assert_equal_to_pytrec(run, qrels)


def test_query_missing_from_run_scores_zero():
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1}}
    run = {"q1": {"d1": 1.0}}
    assert mean_metrics(run, qrels)["recall@10"] == pytest.approx(0.5)


@pytest.mark.slow
def test_bm25_on_nfcorpus_equals_pytrec_eval(mirror_dir, tmp_path):
    """A real run: BM25 over NFCorpus (built straight from the BEIR files), test queries, top 100."""
    from dpr.bm25 import build_index_from_rows
    from dpr.data.beir import iter_beir_corpus, read_qrels, read_queries
    from dpr.data.results import write_trec_run
    from dpr.eval.report import evaluate_qrels
    from dpr.retrieval import BM25Retriever
    from dpr.retrieval.records import trec_run

    root = mirror_dir / "nfcorpus"
    index = build_index_from_rows(iter_beir_corpus(root / "corpus.jsonl"))
    qrels = read_qrels(root / "qrels" / "test.tsv")
    queries = read_queries(root / "queries.jsonl")
    run = trec_run(BM25Retriever(index), {q: queries[q] for q in qrels}, k=100)
    assert len(run) == 323 and all(len(d) == 100 for d in run.values())
    expected = assert_equal_to_pytrec(run, qrels)
    ndcg = sum(v["ndcg@10"] for v in expected.values()) / len(expected)
    # BEIR's published BM25 nDCG@10 on NFCorpus is 0.325 (Anserini, multifield); bm25s reports ~0.32
    assert 0.28 < ndcg < 0.36

    write_trec_run(tmp_path / "bm25.trec", run, tag="bm25")
    report = evaluate_qrels({"bm25": tmp_path / "bm25.trec"}, root / "qrels" / "test.tsv", tmp_path / "ev",
                            num_resamples=100)
    saved = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert saved["systems"]["bm25"]["ndcg@10"] == pytest.approx(ndcg, abs=1e-6)
    assert report["systems"]["bm25"]["mrr@10"] == pytest.approx(
        sum(v["mrr@10"] for v in expected.values()) / len(expected), abs=1e-6)
    assert saved["num_queries"] == 323 and (tmp_path / "ev" / "topk.png").is_file()
