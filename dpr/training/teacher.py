"""Teacher scores of (question, passage) pairs for distillation losses, put in ``masks.teacher``.

- A loss that declares ``teacher = "bm25"`` (e.g. :class:`dpr.losses.LexicalDistillLoss`) gets the BM25
  score of every (question, candidate) pair of its pool: in-batch passages and cached corpus candidates
  alike. Scores come from one ``[questions, corpus]`` BM25 matrix per batch
  (:func:`dpr.bm25.search.score_texts`), columns picked by passage id. The index is the dataset's, built with
  the run's ``bm25.*`` settings (dpr-train's and dpr-pipeline's ``bm25`` section), as the pipeline's BM25 stages
  build it.
- A loss that declares ``teacher = "scores"`` (:class:`dpr.losses.KLDistillLoss`, ``MarginMSELoss``) gets
  the scores of a teacher-scores file (:mod:`dpr.training.teacher_scores`, e.g. a cross-encoder's):
  each question's own scored candidates (its positive and hard negatives); every other pair of the pool
  (another question's passages, topped-up or corpus negatives) is NaN, "not scored".

Every rank builds the masks of its own questions against the global pool, from the same file: the
scores are consistent across ranks without a gather.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import torch

from dpr.bm25.config import BM25Config, index_settings
from dpr.training.denoise import denoise_examples, write_denoise_counts
from dpr.training.imported_scores import IMPORTED_FILE, import_teacher_scores
from dpr.training.teacher_scores import SCORES_FILE, TeacherScores, read_teacher_scores, score_summary

log = logging.getLogger(__name__)


class BM25Teacher:
    def __init__(self, index) -> None:
        self.index = index
        self.row = {pid: j for j, pid in enumerate(index.ids)}

    @classmethod
    def for_dataset(cls, passages: str | Path, index_dir: str | Path,
                    settings: Mapping[str, Any] | None = None) -> "BM25Teacher":
        """The dataset's cached BM25 index with the run's BM25 ``settings`` (`dpr.bm25.config.index_settings`;
        built if missing or stale). The pipeline's BM25 stages keep the same index in the same place with the same
        settings, so the teacher scores as the pipeline's BM25 retrieves, and neither rebuilds the other's index."""
        from dpr.bm25 import get_or_build_index

        return cls(get_or_build_index(passages, index_dir, **index_settings(settings)))

    def scores(self, questions: Sequence[str], passage_ids: Sequence[str]) -> torch.Tensor:
        from dpr.bm25.search import score_texts

        missing = [pid for pid in passage_ids if pid not in self.row]
        if missing:
            raise ValueError(f"passage {missing[0]!r} is not in the BM25 teacher's index")
        full = score_texts(self.index, list(questions))
        cols = [self.row[pid] for pid in passage_ids]
        return torch.from_numpy(full[:, cols])


class ScoreFileTeacher:
    """Scores from a teacher-scores file; NaN where the file has no score of the pair."""

    def __init__(self, store: TeacherScores) -> None:
        self.store = store

    def scores(self, questions: Sequence[str], passage_ids: Sequence[str]) -> torch.Tensor:
        # a question has a few scored passages, a pool up to a whole corpus: map only the scored ones
        rows = [self.store.by_question.get(q, {}) for q in questions]
        needed = set().union(*rows) if rows else set()
        cols: dict[str, list[int]] = {}
        for j, pid in enumerate(passage_ids):
            if pid in needed:
                cols.setdefault(pid, []).append(j)  # one passage may sit twice in a pool (positive and negative)
        out = torch.full((len(questions), len(passage_ids)), float("nan"), dtype=torch.float32)
        for i, row in enumerate(rows):
            for pid, s in row.items():
                for j in cols.get(pid, ()):
                    out[i, j] = s
        return out


class RunTeacher(NamedTuple):
    """What a training run gets from its teacher settings: the teacher for the masks (or None), the
    training examples (denoised with ``train.teacher_denoise``), and what the checkpoints' fingerprint
    must include (the scores file's content)."""

    teacher: Any
    examples: list[dict]
    fingerprint: dict


def bm25_teacher_section(loss: Any, bm25: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``{"bm25": settings}`` when ``loss`` has a BM25 teacher and the run's BM25 settings are not BM25Config's
    defaults, else ``{}``: what a run's identity (the checkpoints' fingerprint, the pipeline's train stage) adds for
    the teacher. Recorded only when set, so runs and stages of the default settings stay what they were."""
    settings = index_settings(bm25)
    if getattr(loss, "teacher", None) != "bm25" or settings == dataclasses.asdict(BM25Config()):
        return {}
    return {"bm25": settings}


def scores_path(tc, dataset_root: str | Path) -> Path:
    """``train.teacher_scores``, or the dataset's ``teacher_scores.jsonl`` where it is empty."""
    return Path(tc.teacher_scores) if tc.teacher_scores else Path(dataset_root) / SCORES_FILE


def prepare_teacher(loss, tc, dataset_root: str | Path, passages: str | Path, train_file: str | Path,
                    examples: list[dict], *, write_counts: bool = True,
                    bm25: Mapping[str, Any] | None = None) -> RunTeacher:
    """The teacher ``loss`` declares (``teacher`` = "bm25" | "scores" | absent) and, with
    ``tc.teacher_denoise``, the examples without the negatives the teacher scores near or above the
    positive (counts written beside the scores file when ``write_counts``). A scores file made for
    another training file is refused. ``bm25``: the run's BM25 section (``bm25.k1``, ``b``, ``stopwords``,
    ``stemmer``; BM25Config's defaults where absent), the BM25 teacher's index settings."""
    kind = getattr(loss, "teacher", None)
    if kind not in (None, "bm25", "scores"):
        raise ValueError(f"loss {type(loss).__name__} wants a {kind!r} teacher; known: bm25, scores")
    store = None
    if kind == "scores" or tc.teacher_denoise:
        path = scores_path(tc, dataset_root)
        imported = Path(dataset_root) / IMPORTED_FILE
        if not tc.teacher_scores and imported.is_file():  # scores that came with imported data (dpr-data import)
            path = import_teacher_scores(imported, train_file, path)
        if not path.is_file():
            why = f"loss {getattr(loss, 'name', type(loss).__name__)}" if kind == "scores" else "train.teacher_denoise"
            raise FileNotFoundError(f"{path}: no teacher scores, which {why} needs: set train.teacher_scores or "
                                    "write them with dpr.training.teacher_scores.score_candidates")
        store = read_teacher_scores(path, train_file)
    if tc.teacher_denoise:
        examples, counts = denoise_examples(examples, store, tc.teacher_denoise_margin)
        if write_counts:
            write_denoise_counts(store, tc.teacher_denoise_margin, counts)
    if kind == "scores" and tc.teacher_scored_negatives:
        examples = keep_scored_negatives(examples, store)
    teacher = None
    if kind == "bm25":
        teacher = BM25Teacher.for_dataset(passages, Path(dataset_root) / "bm25_index", bm25)
    elif kind == "scores":
        teacher = ScoreFileTeacher(store)
    fingerprint = {"teacher_scores": score_summary(store.manifest)} if store else {}
    return RunTeacher(teacher, examples, {**fingerprint, **bm25_teacher_section(loss, bm25)})


def keep_scored_negatives(examples: Sequence[dict], store: TeacherScores) -> list[dict]:
    """Copies of ``examples`` whose hard negatives are the ones the teacher scored for that question, in
    their mined order. A scores file usually holds each question's first few mined negatives
    (``max_negatives``): drawing the training's hard negatives among the other 30 would leave most
    questions with a scored positive and nothing to rank it against. A question the teacher scored no
    negative of keeps its list (it trains on the NLL term, as an unscored pool does)."""
    out, kept, emptied = [], 0, 0
    for ex in examples:
        row = store.by_question.get(ex["question"], {})
        scored = [c for c in ex.get("hard_negative_ctxs") or [] if c["passage_id"] in row]
        if scored:
            out.append({**ex, "hard_negative_ctxs": scored})
            kept += len(scored)
        else:
            out.append(ex)
            emptied += 1
    log.info("hard negatives: the %d teacher-scored ones of %d questions (%d questions without a scored "
             "negative keep their mined list)", kept, len(out), emptied)
    return out
