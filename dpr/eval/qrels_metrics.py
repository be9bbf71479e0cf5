"""Ranking metrics for qrels data (BEIR-style): MRR@10, Recall@k, nDCG@10, as trec_eval computes them.

The definitions follow trec_eval (and so pytrec_eval, which the tests compare against):
- documents are ranked by score, ties broken by document id in *decreasing* string order;
- relevant means a qrels score >= 1 (trec_eval's default ``relevance_level``);
- recall@k = relevant documents in the top k / all relevant documents of the query;
- MRR@10 = 1 / rank of the first relevant document within the top 10 (0 when none);
- nDCG@10 uses the graded qrels score as gain and log2(rank + 1) as discount; the ideal ranking sorts
  the query's judged gains.
Queries are those of the qrels; a query the run does not cover scores 0 on every metric.
"""

from __future__ import annotations

import logging
import math
from typing import Iterable, Mapping

import numpy as np

log = logging.getLogger(__name__)

RELEVANCE_LEVEL = 1
DEFAULT_METRICS = ("ndcg@10", "mrr@10", "recall@10", "recall@100")

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def rank_documents(scores: Mapping[str, float]) -> list[str]:
    """Document ids best first, in trec_eval's order (score desc, then doc id desc)."""
    return [doc for doc, _ in sorted(scores.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)]


def query_metrics(ranked: list[str], judged: Mapping[str, int], metric_names: Iterable[str]) -> dict[str, float]:
    """One query's metrics from its ranked document ids (best first) and its judged grades."""
    relevant = {doc for doc, rel in judged.items() if rel >= RELEVANCE_LEVEL}
    out: dict[str, float] = {}
    for name in metric_names:
        kind, _, cut_s = name.partition("@")
        cut = int(cut_s)
        top = ranked[:cut]
        if kind == "recall":
            out[name] = (sum(doc in relevant for doc in top) / len(relevant)) if relevant else 0.0
        elif kind == "mrr":
            out[name] = next((1.0 / (i + 1) for i, doc in enumerate(top) if doc in relevant), 0.0)
        elif kind == "ndcg":
            dcg = sum(max(judged.get(doc, 0), 0) / math.log2(i + 2) for i, doc in enumerate(top))
            ideal_gains = sorted((g for g in judged.values() if g > 0), reverse=True)[:cut]
            idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal_gains))
            out[name] = dcg / idcg if idcg > 0 else 0.0
        else:
            raise ValueError(f"unknown metric {name!r}; expected ndcg@k, mrr@k or recall@k")
    return out


def per_query_metrics(
    run: Run, qrels: Qrels, metrics: Iterable[str] = DEFAULT_METRICS
) -> tuple[list[str], dict[str, np.ndarray]]:
    """Per-query values: ``(query_ids, {metric: array aligned with query_ids})`` over the qrels' queries."""
    metrics = list(metrics)
    query_ids = sorted(qrels)
    missing = [q for q in query_ids if q not in run]
    if missing:
        log.warning("%d of %d qrels queries have no results in the run (scored 0), e.g. %s",
                    len(missing), len(query_ids), missing[0])
    values = {m: np.zeros(len(query_ids), dtype=np.float64) for m in metrics}
    for i, qid in enumerate(query_ids):
        if qid not in run:
            continue
        per_q = query_metrics(rank_documents(run[qid]), qrels[qid], metrics)
        for m in metrics:
            values[m][i] = per_q[m]
    return query_ids, values


def mean_metrics(run: Run, qrels: Qrels, metrics: Iterable[str] = DEFAULT_METRICS) -> dict[str, float]:
    """Mean of each metric over the qrels' queries."""
    _, values = per_query_metrics(run, qrels, metrics)
    return {m: float(v.mean()) if len(v) else 0.0 for m, v in values.items()}


def recall_curve(run: Run, qrels: Qrels, ks: Iterable[int]) -> dict[int, float]:
    """Mean recall@k for each k (for the report's plot)."""
    ks = list(ks)
    means = mean_metrics(run, qrels, [f"recall@{k}" for k in ks])
    return {k: means[f"recall@{k}"] for k in ks}
