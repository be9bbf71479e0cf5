"""The tests' BM25-like hard negatives on the tiny dataset (one helper for every cross-encoder/reader test)."""

from __future__ import annotations

import json
from pathlib import Path


def with_negatives(data_dir: Path, count: int = 3) -> Path:
    """Give each question of ``<data_dir>/tiny/train.json`` the positive passages of the ``count`` questions after it
    as ``hard_negative_ctxs`` (rewritten in place); returns the file."""
    path = data_dir / "tiny" / "train.json"
    data = json.loads(path.read_text())
    for i, ex in enumerate(data):
        ex["hard_negative_ctxs"] = [data[(i + j) % len(data)]["positive_ctxs"][0] for j in range(1, count + 1)]
    path.write_text(json.dumps(data))
    return path
