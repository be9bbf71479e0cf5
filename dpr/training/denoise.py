"""Denoised hard negatives: a mined negative the teacher scores above the positive, or within a margin of
it, is probably relevant (a false negative: RocketQA's denoising) and is dropped before training.

For each training question, with ``pos`` the lowest teacher score among its scored positives
(``positive_ctxs``), a ``hard_negative_ctxs`` / ``negative_ctxs`` passage with teacher score ``s`` is

- dropped when ``s > pos - margin`` (``dropped_above_positive`` when ``s > pos``, else ``dropped_within_margin``);
- kept otherwise, and kept unexamined when the teacher did not score it (``unscored``) or scored none of
  the question's positives (``questions_without_positive_score``).

The counts are logged and written beside the scores file (``<scores>.denoise.json``), as the BM25
miner's filters are (:mod:`dpr.negatives.bm25`). train.json is not rewritten (that would make the teacher's
scores of it stale): the trainer denoises the examples it loaded (``train.teacher_denoise``).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Sequence

from dpr.atomic import write_json_atomic
from dpr.training.teacher_scores import TeacherScores

log = logging.getLogger(__name__)

COUNTS = ("questions", "examined", "kept", "dropped_above_positive", "dropped_within_margin", "unscored",
          "questions_without_positive_score")


def denoise_examples(examples: Sequence[dict], scores: TeacherScores, margin: float = 0.0) -> tuple[list[dict], dict]:
    """Copies of ``examples`` without the negatives the teacher scores above ``pos - margin``; and counts."""
    if not margin >= 0:
        raise ValueError(f"train.teacher_denoise_margin must be >= 0, got {margin}")
    counts: Counter = Counter()
    out = []
    for ex in examples:
        q = ex["question"]
        counts["questions"] += 1
        pos = [s for s in (scores.score(q, c["passage_id"]) for c in ex["positive_ctxs"]) if s is not None]
        if not pos:
            counts["questions_without_positive_score"] += 1
            out.append(ex)
            continue
        threshold = min(pos) - margin
        kept_ex = dict(ex)
        for key in ("hard_negative_ctxs", "negative_ctxs"):
            kept = []
            for ctx in ex.get(key) or []:
                s = scores.score(q, ctx["passage_id"])
                if s is None:
                    counts["unscored"] += 1
                    kept.append(ctx)
                    continue
                counts["examined"] += 1
                if s > threshold:
                    counts["dropped_above_positive" if s > min(pos) else "dropped_within_margin"] += 1
                else:
                    counts["kept"] += 1
                    kept.append(ctx)
            kept_ex[key] = kept
        out.append(kept_ex)
    stats = {key: int(counts[key]) for key in COUNTS}
    log.info("teacher denoising (margin %g): %d of %d scored negatives dropped (%d above the positive, %d within "
             "the margin); %d unscored kept; %d questions without a scored positive", margin,
             stats["dropped_above_positive"] + stats["dropped_within_margin"], stats["examined"],
             stats["dropped_above_positive"], stats["dropped_within_margin"], stats["unscored"],
             stats["questions_without_positive_score"])
    return out, stats


def counts_path(scores_path: str | Path) -> Path:
    """``teacher_scores.jsonl`` -> ``teacher_scores.denoise.json``."""
    p = Path(scores_path)
    return p.with_name(p.stem + ".denoise.json")


def write_denoise_counts(scores: TeacherScores, margin: float, counts: dict) -> Path:
    """The counts beside the scores file, with the scores' fingerprints (which teacher, which data)."""
    path = counts_path(scores.path)
    write_json_atomic(path, {"margin": float(margin), "teacher": scores.manifest.get("teacher"),
                             "data": scores.manifest.get("data"), "counts": counts})
    return path
