"""Evaluation: DPR's has_answer, top-k accuracy, qrels metrics, bootstrap statistics and the report.

Submodules are imported on first use so that ``dpr.eval.has_answer`` stays a cheap leaf import.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "has_answer": "dpr.eval.has_answer",
    "top_k_accuracy": "dpr.eval.topk",
    "first_hit_ranks": "dpr.eval.topk",
    "mean_metrics": "dpr.eval.qrels_metrics",
    "per_query_metrics": "dpr.eval.qrels_metrics",
    "bootstrap_means": "dpr.eval.stats",
    "confidence_interval": "dpr.eval.stats",
    "paired_bootstrap_pvalue": "dpr.eval.stats",
    "sign_test_pvalue": "dpr.eval.stats",
    "overlap": "dpr.eval.stats",
    "evaluate_qa": "dpr.eval.report",
    "evaluate_qrels": "dpr.eval.report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dpr.eval' has no attribute {name!r}")
