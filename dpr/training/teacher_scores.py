"""A teacher's scores of each training question's candidate passages, computed once and cached on disk.

``score_candidates(scorer, train_json, out, teacher_fingerprint=...)`` asks any scorer (a cross-encoder,
BM25, a bi-encoder: ``scorer(questions, passages) -> scores``, one score per (question, passage) pair,
the passages as train.json ctx dicts) for the scores of every training question's candidates -- its
``positive_ctxs`` then its ``hard_negative_ctxs`` and ``negative_ctxs`` (judged-relevant ones excluded,
the first ``max_negatives`` kept; 0 = all) -- and writes, beside the prepared data:

- ``teacher_scores.jsonl``: one record per training question, in train.json order:
  ``{"index": i, "question": "...", "passage_ids": [...], "scores": [...]}``;
- ``teacher_scores.json``: the manifest, written last (the file counts as finished only with it):
  ``teacher`` (the teacher's fingerprint, e.g. :func:`dpr.index.fingerprint.model_fingerprint` of the
  cross-encoder), ``data`` (sha256 of train.json), ``candidates`` (sha256 of every question's candidate
  ids and the selection settings), counts and the jsonl's own sha256.

Like the embedding shards, the work is resumable: questions are scored in chunks, each written aside
and renamed into ``.<name>.parts/`` (with the fingerprints it was made for), so a killed run redoes at
most one chunk. A finished file is reused when teacher, data and candidates are those asked for, and
refused (one line naming what changed) when any differs -- ``overwrite=True`` rescores. Readers
(:func:`read_teacher_scores`) validate every record (one line naming file, line and field).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from dpr.atomic import atomic_path, path_lock, sha256_file, write_json_atomic
from dpr.data.retriever_json import read_retriever_json, relevant_ids
from dpr.errors import DataError

log = logging.getLogger(__name__)

SCORES_FILE = "teacher_scores.jsonl"
FORMAT = 1
Scorer = Callable[[Sequence[str], Sequence[dict]], Sequence[float]]
_FIELDS = ("index", "question", "passage_ids", "scores")
_CHECKED = ("teacher", "data", "candidates")  # what makes a scores file stale


def manifest_path(scores_path: str | Path) -> Path:
    """``teacher_scores.jsonl`` -> ``teacher_scores.json``."""
    return Path(scores_path).with_suffix(".json")


def parts_dir(scores_path: str | Path) -> Path:
    p = Path(scores_path)
    return p.with_name(f".{p.name}.parts")


def candidates_of(example: dict, max_negatives: int = 0) -> list[dict]:
    """The passages of ``example`` a teacher scores: every positive ctx, then its hard and other negatives
    (de-duplicated, judged-relevant ones left out, the first ``max_negatives``; 0 = all)."""
    relevant = relevant_ids(example)
    positives, negatives, seen = [], [], set()
    for ctx in example["positive_ctxs"]:
        if ctx["passage_id"] not in seen:
            positives.append(ctx)
            seen.add(ctx["passage_id"])
    for ctx in list(example.get("hard_negative_ctxs") or []) + list(example.get("negative_ctxs") or []):
        pid = ctx["passage_id"]
        if pid not in seen and pid not in relevant:
            negatives.append(ctx)
            seen.add(pid)
    return positives + (negatives[:max_negatives] if max_negatives > 0 else negatives)


def candidates_fingerprint(examples: Sequence[dict], max_negatives: int) -> str:
    """sha256 over each question and its candidate ids (and the selection setting)."""
    h = hashlib.sha256(json.dumps({"max_negatives": int(max_negatives)}).encode())
    for ex in examples:
        ids = [c["passage_id"] for c in candidates_of(ex, max_negatives)]
        h.update(json.dumps([ex["question"], ids], ensure_ascii=False).encode() + b"\n")
    return "sha256:" + h.hexdigest()


@dataclass
class ScoreRecord:
    index: int
    question: str
    passage_ids: list[str]
    scores: list[float]

    def as_json(self) -> str:
        return json.dumps({"index": self.index, "question": self.question, "passage_ids": self.passage_ids,
                           "scores": self.scores}, ensure_ascii=False)


def parse_record(line: str, path: str | Path, line_no: int, expected_index: int | None = None) -> ScoreRecord:
    """One jsonl line as a :class:`ScoreRecord`; a malformed one is a DataError naming file, line, field."""
    try:
        obj = json.loads(line)
    except ValueError as err:
        raise DataError(path, f"not valid JSON ({err.msg})", line=line_no) from None
    if not isinstance(obj, dict):
        raise DataError(path, f"expected a JSON object, got {type(obj).__name__}", line=line_no)
    for key in obj:
        if key not in _FIELDS:
            raise DataError(path, f"unknown field (known: {', '.join(_FIELDS)})", line=line_no, field=str(key))
    for key in _FIELDS:
        if key not in obj:
            raise DataError(path, "missing", line=line_no, field=key)
    index, question, ids, scores = (obj[k] for k in _FIELDS)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise DataError(path, f"must be an integer >= 0, got {index!r}", line=line_no, field="index")
    if expected_index is not None and index != expected_index:
        raise DataError(path, f"records must follow train.json's order: expected {expected_index}, got {index}",
                        line=line_no, field="index")
    if not isinstance(question, str):
        raise DataError(path, f"must be a string, got {type(question).__name__}", line=line_no, field="question")
    if not isinstance(ids, list) or not all(isinstance(pid, str) for pid in ids):
        raise DataError(path, "must be a list of passage id strings", line=line_no, field="passage_ids")
    if len(set(ids)) != len(ids):
        raise DataError(path, "a passage id appears twice", line=line_no, field="passage_ids")
    if not isinstance(scores, list) or not all(isinstance(s, (int, float)) and not isinstance(s, bool)
                                               for s in scores):
        raise DataError(path, "must be a list of numbers", line=line_no, field="scores")
    if len(scores) != len(ids):
        raise DataError(path, f"{len(scores)} scores for {len(ids)} passage ids", line=line_no, field="scores")
    if not all(math.isfinite(s) for s in scores):
        raise DataError(path, "non-finite score (NaN or inf)", line=line_no, field="scores")
    return ScoreRecord(index, question, ids, [float(s) for s in scores])


def iter_records(path: str | Path) -> Iterator[ScoreRecord]:
    """The records of a scores jsonl, validated; indices must run 0, 1, 2, ... (train.json's order)."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            yield parse_record(line, path, n, expected_index=n - 1)


@dataclass
class TeacherScores:
    """A finished scores file: its manifest and every (question text, passage id) -> score.

    Scores are keyed by question text (what a batch knows of its questions): a teacher's score depends
    on the question and the passage only, so duplicate questions of train.json share their scores."""

    path: Path
    manifest: dict
    by_question: dict[str, dict[str, float]] = field(default_factory=dict)

    def score(self, question: str, passage_id: str) -> float | None:
        return self.by_question.get(question, {}).get(passage_id)


def read_manifest(scores_path: str | Path) -> dict | None:
    """The manifest of a finished scores file, or None where there is none."""
    mpath = manifest_path(scores_path)
    if not mpath.is_file():
        return None
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except ValueError as err:
        raise DataError(mpath, f"not valid JSON ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(mpath, f"not a teacher-scores manifest of format {FORMAT}", field="format")
    return manifest


def read_teacher_scores(scores_path: str | Path, train_json: str | Path | None = None) -> TeacherScores:
    """Read and validate a finished scores file; with ``train_json``, refuse it when scored for other data."""
    path = Path(scores_path)
    manifest = read_manifest(path)
    if manifest is None or not path.is_file():
        raise FileNotFoundError(f"{path}: no finished teacher scores (with {manifest_path(path).name}); "
                                f"write them with dpr-rerank teacher-scores model=<cross-encoder dir> data=<dataset> output={path}")
    if sha256_file(path) != manifest.get("file_sha256"):
        raise DataError(path, f"changed since {manifest_path(path).name} was written (sha256 differs); rescore it",
                        field="file_sha256")
    if train_json is not None:
        data = "sha256:" + sha256_file(train_json)
        if manifest.get("data") != data:
            raise DataError(manifest_path(path), f"scored for another {Path(train_json).name} ({manifest.get('data')}, "
                            f"now {data}): rescore with dpr-rerank teacher-scores model=<cross-encoder dir> "
                            f"train_file={train_json} output={path}", field="data")
    store = TeacherScores(path, manifest)
    count = 0
    for rec in iter_records(path):
        row = store.by_question.setdefault(rec.question, {})
        for pid, s in zip(rec.passage_ids, rec.scores):
            row.setdefault(pid, s)  # a duplicate question's first record wins (a teacher scores it alike)
        count += 1
    if count != manifest.get("questions"):
        raise DataError(path, f"{count} records, the manifest says {manifest.get('questions')}", field="questions")
    return store


def _refuse_if_stale(where: Path, found: dict, expected: dict) -> None:
    for key in _CHECKED:
        if found.get(key) != expected[key]:
            what = {"teacher": "teacher", "data": "training data", "candidates": "candidates"}[key]
            raise DataError(where, f"stale: scored with another {what} ({found.get(key)}, now {expected[key]}); "
                            "pass overwrite=True to rescore", field=key)


def score_candidates(
    scorer: Scorer,
    train_json: str | Path,
    out: str | Path,
    *,
    teacher_fingerprint: str,
    max_negatives: int = 0,
    chunk_size: int = 512,
    overwrite: bool = False,
) -> dict:
    """Score every training question's candidates with ``scorer`` into ``out`` (see the module docstring);
    returns the manifest. Reused when up to date, refused when stale unless ``overwrite``."""
    if chunk_size < 1 or max_negatives < 0:
        raise ValueError(f"need chunk_size >= 1 and max_negatives >= 0, got {chunk_size}, {max_negatives}")
    if not teacher_fingerprint:
        raise ValueError("score_candidates needs a teacher_fingerprint (e.g. model_fingerprint(<teacher dir>))")
    out, train_json = Path(out), Path(train_json)
    with path_lock(out):  # a second writer of the same file waits, then finds it finished
        return _score_candidates(scorer, train_json, out, str(teacher_fingerprint), max_negatives, chunk_size,
                                 overwrite)


def _score_candidates(scorer: Scorer, train_json: Path, out: Path, teacher_fingerprint: str, max_negatives: int,
                      chunk_size: int, overwrite: bool) -> dict:
    examples = read_retriever_json(train_json)
    expected = {"format": FORMAT, "teacher": teacher_fingerprint, "data": "sha256:" + sha256_file(train_json),
                "candidates": candidates_fingerprint(examples, max_negatives), "max_negatives": int(max_negatives)}
    parts = parts_dir(out)
    found = read_manifest(out)
    if found is not None and not overwrite:
        _refuse_if_stale(manifest_path(out), found, expected)
        if out.is_file() and sha256_file(out) == found.get("file_sha256"):
            log.info("%s: teacher scores up to date (%d questions): reused", out, found.get("questions", 0))
            shutil.rmtree(parts, ignore_errors=True)  # leftovers of a run killed after its manifest
            return found
    if found is not None:
        manifest_path(out).unlink()  # an outdated file stops counting as finished right away
    progress = parts / "progress.json"
    if parts.is_dir() and progress.is_file() and not overwrite:
        _refuse_if_stale(progress, json.loads(progress.read_text(encoding="utf-8")), expected)
    elif parts.exists():
        shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    write_json_atomic(progress, expected)
    chunks = [(a, min(a + chunk_size, len(examples))) for a in range(0, len(examples), chunk_size)]
    pairs = 0
    for a, b in chunks:
        chunk_file = parts / f"chunk_{a:09d}.jsonl"
        if chunk_file.is_file():
            continue  # scored by an earlier, interrupted run with the same teacher, data and candidates
        lines = _score_chunk(scorer, examples, a, b, max_negatives)
        with atomic_path(chunk_file) as tmp:
            tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        log.info("teacher scores: questions %d-%d of %d", a, b, len(examples))
    with atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for a, _ in chunks:
            text = (parts / f"chunk_{a:09d}.jsonl").read_text(encoding="utf-8")
            pairs += sum(len(json.loads(line)["passage_ids"]) for line in text.splitlines())
            f.write(text)
    manifest = {**expected, "questions": len(examples), "pairs": pairs, "file_sha256": sha256_file(out)}
    write_json_atomic(manifest_path(out), manifest)
    shutil.rmtree(parts, ignore_errors=True)
    log.info("%s: %d teacher scores of %d questions", out, pairs, len(examples))
    return manifest


def _score_chunk(scorer: Scorer, examples: Sequence[dict], a: int, b: int, max_negatives: int) -> list[str]:
    """One chunk's records (jsonl lines): the scorer is called once with every pair of the chunk."""
    cands = [candidates_of(examples[i], max_negatives) for i in range(a, b)]
    questions = [examples[i]["question"] for i, c in zip(range(a, b), cands) for _ in c]
    passages = [ctx for c in cands for ctx in c]
    scores = [float(s) for s in scorer(questions, passages)] if passages else []
    if len(scores) != len(passages):
        raise ValueError(f"the scorer returned {len(scores)} scores for {len(passages)} (question, passage) pairs")
    lines, pos = [], 0
    for i, c in zip(range(a, b), cands):
        row = scores[pos:pos + len(c)]
        pos += len(c)
        bad = [ctx["passage_id"] for ctx, s in zip(c, row) if not math.isfinite(s)]
        if bad:
            raise ValueError(f"the scorer gave a non-finite score to question {i} and passage {bad[0]!r}")
        lines.append(ScoreRecord(i, examples[i]["question"], [ctx["passage_id"] for ctx in c], row).as_json())
    return lines


def score_summary(manifest: dict) -> dict[str, Any]:
    """What a run records of the scores it trained with (its checkpoints' fingerprint includes it)."""
    return {key: manifest.get(key) for key in ("teacher", "data", "candidates", "file_sha256")}
