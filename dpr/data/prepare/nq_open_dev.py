"""nq_open_dev: the NQ-open dev questions (3,610) with their answer lists, as ``test.qa.tsv`` only.

There is no passage corpus: NQ-open is meant to be evaluated against a Wikipedia dump such as DPR's
psgs_w100.tsv, which the user brings (put it at ``passages.tsv`` or point the pipeline at it).
"""

from __future__ import annotations

from pathlib import Path

from dpr.data.nq_open import read_nq_open
from dpr.data.prepare.common import dedup
from dpr.data.qa import QAPair, write_qa_tsv

KIND = "qa"
VERSION = 1
SOURCES = {"dev": "nq-open-dev"}
DEFAULTS: dict = {}


def build(cfg: dict, files: dict[str, Path], out: Path) -> dict:
    pairs = [QAPair(q, dedup(a)) for q, a in read_nq_open(files["dev"])]
    write_qa_tsv(out / "test.qa.tsv", pairs)
    return {
        "counts": {"passages": 0, "questions": {"train": 0, "dev": 0, "test": len(pairs)}},
        "corpus": None,
        "notes": ["no passage corpus: bring one (e.g. DPR's psgs_w100.tsv) as passages.tsv"],
    }
