"""What a QA evaluation reports: the one source of these defaults for ``dpr-eval`` (the keys at its root),
``dpr-pipeline`` (its ``eval`` section) and `dpr.eval.report.evaluate_qa`; and how its uncertainty is estimated
(`BootstrapConfig`: ``dpr-eval``'s ``resamples`` and ``seed``, and `dpr.eval.stats`' defaults). Registered in
Hydra's ConfigStore as ``eval_cfg/default`` and ``bootstrap_cfg/default`` (`register_schema`); the fields carry their
ranges (``ranged``), from which the commands' schemas (`dpr.cli.schemas`) are generated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from dpr.checks import MAX_K, MAX_RESAMPLES, SEED_MAX
from dpr.config import ranged, ranged_list, register_defaults


@dataclass
class EvalConfig:
    ks: List[int] = ranged_list(1, MAX_K, default=lambda: [1, 5, 10, 20, 50, 100])  # top-k accuracy at these k
    match: str = "string"  # has_answer mode: string (DPR default) | regex (CuratedTREC patterns)


@dataclass
class BootstrapConfig:
    """The confidence intervals and paired tests of a report (`dpr.eval.stats`). Not in the pipeline's ``eval``
    section: that section is its eval stage's recorded parameters, and the pipeline keeps these defaults."""

    resamples: int = ranged(1000, 1, MAX_RESAMPLES)  # bootstrap resamples for CIs and paired tests
    seed: int = ranged(0, 0, SEED_MAX)               # the resamples' seed: the same seed, the same intervals


def register_schema() -> None:
    """``eval_cfg/default`` and ``bootstrap_cfg/default``: EvalConfig's and BootstrapConfig's defaults, for
    conf/eval.yaml and conf/pipeline.yaml to select."""
    register_defaults("eval_cfg", "default", EvalConfig)
    register_defaults("bootstrap_cfg", "default", BootstrapConfig)
