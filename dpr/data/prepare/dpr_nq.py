"""dpr_nq: DPR's Natural Questions retriever data against its 21M Wikipedia passages (`psgs_w100.tsv`), from
DPR's own published files; the build is `dpr.data.prepare.dpr_published`, the fetching `dpr_files`."""

from __future__ import annotations

from pathlib import Path

from dpr.data.prepare.dpr_files import fetch_sources as _fetch
from dpr.data.prepare.dpr_published import build

KIND = "qa"
VERSION = 1
SOURCES: dict = {}  # not in the registry: DPR publishes no digests (dpr.data.ledger records them)
ROLES = {
    "passages": "psgs_w100.tsv",
    "train": "biencoder-nq-train.json",
    "dev": "biencoder-nq-dev.json",
    "test": "nq-test.qa.csv",
}
DEFAULTS: dict = {}  # where the files come from is not the dataset: their digests are (fetch_sources)


def fetch_sources(cfg: dict, mirror: str | Path | None, cache: str | Path) -> tuple[dict[str, Path], dict[str, dict]]:
    return _fetch(cfg, ROLES, mirror, cache)


__all__ = ["build", "fetch_sources", "ROLES"]
