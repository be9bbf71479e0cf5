"""The settings of ``dpr-export``: one dataclass is its schema and the one source of its defaults.

Registered in Hydra's ConfigStore as ``export_cfg/default`` (`register_schema`), which conf/export.yaml places
at the root; ``dpr-export`` checks the composed config against `ExportConfig` (types, unknown keys, the format)
before it reads a file, so ``check=maybe`` or ``format=onnx`` is one line naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import MISSING

FORMATS = ("sentence-transformers",)


@dataclass
class ExportConfig:
    model_path: str = MISSING           # a run directory (biencoder.json, ...) or a dpr-rerank cross-encoder directory
    format: str = "sentence-transformers"
    output: str = MISSING               # the directory to write
    report: Optional[str] = None        # evaluation report.json for the model card (null: <run>/../eval/report.json)
    model_name: Optional[str] = None    # the card's title (null: dpr-<dataset>)
    # shared tower only, e.g. {query: "query: ", document: "passage: "} (a model trained without: leave null)
    prompts: Optional[Any] = None
    check: bool = False                 # after exporting, compare vectors / scores with the run's on a built-in sample
    # Matryoshka: recorded as the copy's truncate_dim (config_sentence_transformers.json), so encode returns each
    # vector's first dim coordinates (null: the full vectors; > the model's size: one line)
    dim: Optional[int] = None


def register_schema() -> None:
    """``export_cfg/default``: ExportConfig's defaults, for conf/export.yaml to select."""
    from dpr.config import register_defaults

    register_defaults("export_cfg", "default", ExportConfig)
