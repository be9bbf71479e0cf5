"""Dev validation of a cross-encoder: rerank a first stage's dev top k and measure the new order.

QA data (answers, DPR's has_answer rule): top-1/5/20 accuracy and ``mrr`` (mean of 1 / rank of the first
answer-bearing passage, 0 when none is in the list). qrels data (judged grades per query id): nDCG@10,
MRR@10, Recall@10 as `dpr.eval.qrels_metrics` computes them (`dpr.eval.ranking.results_metrics`). The
primary metric is ``mrr`` on QA data (it moves with every rank, where top-20 of a reranked top 20 cannot
move at all) and ``ndcg@10`` on qrels data; greater is better for all of them.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from dpr.eval.ranking import results_metrics
from dpr.rerank.score import rerank_results


class RerankValidator:
    """The trainer's dev check: holds the dev records (and qrels), names its primary metric."""

    greater_is_better = True

    def __init__(self, results: Sequence[Mapping[str, Any]], k: int, settings: Mapping[str, Any], *,
                 qrels: Mapping[str, Mapping[str, int]] | None = None, primary_metric: str = "auto",
                 batch_size: int = 32, precision: str = "auto") -> None:
        self.results, self.k, self.settings, self.qrels = list(results), int(k), dict(settings), qrels
        self.primary_metric = ("ndcg@10" if qrels is not None else "mrr") if primary_metric == "auto" else primary_metric
        self.batch_size, self.precision = batch_size, precision
        if qrels is not None and self.primary_metric in ("mrr", "top1", "top5", "top20"):
            raise ValueError(f"best_metric={self.primary_metric} is a QA metric; qrels data has ndcg@10, mrr@10, recall@10")
        if self.primary_metric.startswith("top") and int(self.primary_metric[3:]) > self.k:
            raise ValueError(f"best_metric={self.primary_metric}: deeper than the reranked top {self.k}")
        if qrels is None and "@" in self.primary_metric:
            raise ValueError(f"best_metric={self.primary_metric} needs qrels data; QA data has mrr, top1, top5, top20")

    def __call__(self, model: Any, tokenizer: Any) -> dict[str, float]:
        t0 = time.perf_counter()
        reranked = rerank_results(model, tokenizer, self.results, self.k, self.settings,
                                  batch_size=self.batch_size, autocast=self.precision)
        metrics = results_metrics(reranked, self.qrels, max_k=self.k)
        metrics["seconds_per_question"] = (time.perf_counter() - t0) / max(1, len(self.results))
        return metrics

    def is_better(self, value: float, best: float | None) -> bool:
        return best is None or value > best
