"""Metrics of results lists in their list order (a reranker's output, whose scores are not comparable with
the first stage's): QA top-k accuracy and MRR by DPR's has_answer, or qrels metrics by each record's
``query_id``. The cross-encoder's dev validation and ``dpr-rerank``'s before/after report share them."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from dpr.eval.topk import NO_HIT, first_hit_ranks, top_k_accuracy

QA_KS = (1, 5, 20)


def results_metrics(results: Sequence[Mapping[str, Any]], qrels: Mapping[str, Mapping[str, int]] | None = None,
                    max_k: int | None = None) -> dict[str, float]:
    """Metrics of results in their list order (QA: has_answer; with ``qrels``: by each record's ``query_id``);
    QA top-k only for k <= ``max_k`` (the reranked depth: top-20 of a top 5 says nothing)."""
    if qrels is not None:
        from dpr.eval.qrels_metrics import mean_metrics

        run = {}
        for rec in results:
            n = len(rec["ctxs"])  # the list order is the ranking: scores made strictly decreasing with rank
            run[str(rec["query_id"])] = {str(c["id"]): float(n - j) for j, c in enumerate(rec["ctxs"])}
        return mean_metrics(run, {q: qrels[q] for q in run if q in qrels}, ("ndcg@10", "mrr@10", "recall@10"))
    ranks = first_hit_ranks(results, desc="dev has_answer")
    ks = [k for k in QA_KS if max_k is None or k <= max_k] or [max_k]
    out = {f"top{k}": v for k, v in top_k_accuracy(ranks, ks).items()}
    rr = np.where(ranks == NO_HIT, 0.0, 1.0 / (np.minimum(ranks, NO_HIT - 1) + 1.0))
    out["mrr"] = float(rr.mean()) if len(rr) else 0.0
    return out
