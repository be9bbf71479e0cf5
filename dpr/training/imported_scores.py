"""Teacher scores that came with imported data, as the project's own teacher-scores file.

``dpr-data data=import`` keeps the scores a training set arrived with (FlagEmbedding ``pos_scores`` /
``neg_scores``, sentence-transformers ``scores`` columns) in ``teacher_scores.imported.jsonl``
(:mod:`dpr.data.formats.scores`). :func:`import_teacher_scores` turns them into the fingerprinted
``teacher_scores.jsonl`` that a cross-encoder teacher writes (:func:`dpr.training.teacher_scores.score_candidates`
with a scorer that looks the scores up), so the distillation losses and denoising use them unchanged, and a
changed training file or imported file makes the result stale in the same way.

The teacher's fingerprint is ``imported:sha256:<imported file>``. Every candidate of a training question
(its positives and negatives, as in train.json) must have an imported score: a passage added after the
import (BM25 mining rewrites ``hard_negative_ctxs``) has none, and is one error naming question and passage
rather than a silent gap in the teacher's distribution.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dpr.atomic import sha256_file
from dpr.data.formats.scores import FILE_NAME as IMPORTED_FILE
from dpr.data.formats.scores import read_teacher_scores as read_imported
from dpr.data.retriever_json import read_retriever_json
from dpr.training.teacher_scores import SCORES_FILE, read_manifest, score_candidates

log = logging.getLogger(__name__)

__all__ = ["IMPORTED_FILE", "import_teacher_scores"]


def import_teacher_scores(imported: str | Path, train_file: str | Path, out: str | Path | None = None) -> Path:
    """Write (or reuse, when up to date) ``out`` (default: ``teacher_scores.jsonl`` beside ``imported``) from
    the imported scores of ``train_file``'s questions; returns its path."""
    imported, train_file = Path(imported), Path(train_file)
    out = Path(out) if out is not None else imported.with_name(SCORES_FILE)
    by_query = read_imported(imported)  # validated: file, line and field on a malformed record
    examples = read_retriever_json(train_file)
    qid_of = {ex["question"]: str(ex.get("query_id", ex["question"])) for ex in examples}

    def lookup(questions: list[str], passages: list[dict]) -> list[float]:
        scores = []
        for question, ctx in zip(questions, passages):
            qid, pid = qid_of[question], str(ctx["passage_id"])
            score = by_query.get(qid, {}).get(pid)
            if score is None:
                raise ValueError(f"{imported}: no imported score for question {qid!r} and passage {pid!r} of "
                                 f"{train_file} (the imported scores cover the imported candidates only; a passage "
                                 "mined after the import has none: re-import, or distil without mining)")
            scores.append(score)
        return scores

    # A file derived from earlier imported scores is rewritten when they or the data changed (nothing is lost:
    # its source is the imported file); one any other teacher wrote stays refused when stale, as always.
    found = read_manifest(out)
    derived = found is not None and str(found.get("teacher", "")).startswith("imported:")
    fingerprint = f"imported:sha256:{sha256_file(imported)}"
    stale = derived and (found.get("teacher") != fingerprint or found.get("data") != f"sha256:{sha256_file(train_file)}")
    manifest = score_candidates(lookup, train_file, out, teacher_fingerprint=fingerprint, overwrite=stale)
    log.info("%s: %d questions' imported teacher scores (%d pairs) from %s", out, manifest.get("questions", 0),
             manifest.get("pairs", 0), imported)
    return out
