"""What a QA evaluation reports: the one source of these defaults for ``dpr-eval`` (the keys at its root),
``dpr-pipeline`` (its ``eval`` section) and `dpr.eval.report.evaluate_qa`. Registered in Hydra's ConfigStore as
``eval_cfg/default`` (`register_schema`); types and ranges: the commands' schemas (`dpr.cli.schemas`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from dpr.config import register_defaults


@dataclass
class EvalConfig:
    ks: List[int] = field(default_factory=lambda: [1, 5, 10, 20, 50, 100])  # top-k accuracy at these k
    match: str = "string"  # has_answer mode: string (DPR default) | regex (CuratedTREC patterns)


def register_schema() -> None:
    """``eval_cfg/default``: EvalConfig's defaults, for conf/eval.yaml and conf/pipeline.yaml to select."""
    register_defaults("eval_cfg", "default", EvalConfig)
