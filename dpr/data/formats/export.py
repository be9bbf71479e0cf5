"""A prepared dataset written out in a peer's format (`dpr.data.formats`), its mined hard negatives
(``hard_negative_ctxs``) and imported teacher scores included, so a set mined here trains there too.

Answer strings (QA data) and DPR's random ``negative_ctxs`` have no place in these formats and are
not written; titled passages become ``title text`` strings in the formats without titles.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dpr.data.dataset import DatasetPaths
from dpr.data.formats import FORMATS
from dpr.data.formats.common import question_id
from dpr.data.formats.scores import FILE_NAME as SCORES_FILE, read_teacher_scores
from dpr.data.retriever_json import read_retriever_json
from dpr.errors import DataError

log = logging.getLogger(__name__)
SPLITS = {"all": ("train", "dev"), "train": ("train",), "dev": ("dev",)}


def export_dataset(root: str | Path, fmt: str, output: str | Path, split: str = "all") -> dict:
    """Write ``<root>/{train,dev}.json`` (``split``: all | train | dev) to ``output`` in format ``fmt``;
    returns the writer's counts (records written, questions it could not express)."""
    ds = DatasetPaths(root)
    if fmt not in FORMATS:
        raise DataError("config", f"format={fmt!r}: expected one of {', '.join(FORMATS)}", field="format")
    if split not in SPLITS:
        raise DataError("config", f"split={split!r}: expected one of {', '.join(SPLITS)}", field="split")
    if not ds.train.is_file():
        raise FileNotFoundError(f"{ds.train}: no prepared dataset here (prepare it with dpr-data first)")
    examples = []
    for s in SPLITS[split]:
        path = ds.train if s == "train" else ds.dev
        if path.is_file():
            examples += [ex for ex in read_retriever_json(path) if ex["positive_ctxs"]]
    for ex in examples:  # QA data has no query ids: the content id the importers would give
        ex.setdefault("query_id", question_id(ex["question"]))
    scores = read_teacher_scores(ds.root / SCORES_FILE)
    if scores and not FORMATS[fmt].HAS_SCORES:
        log.warning("%s: the %s format has no place for the %d questions' teacher scores (not written)",
                    output, fmt, len(scores))
    counts = FORMATS[fmt].write(output, examples, scores)
    if counts.get("dropped_questions"):
        log.warning("%s: %d questions without hard negatives cannot be written in this layout (left out)",
                    output, counts["dropped_questions"])
    log.info("%s: %s (%s, %d questions)", output, counts, fmt, len(examples))
    return {**counts, "questions": len(examples)}
