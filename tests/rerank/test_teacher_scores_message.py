"""A missing or stale teacher-scores file names the command that writes it (``dpr-rerank teacher-scores``), not a
Python function."""

from __future__ import annotations

import json

import pytest

from dpr.errors import DataError
from dpr.training.teacher_scores import manifest_path, read_teacher_scores, score_candidates


def test_missing_scores_name_the_command_that_writes_them(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        read_teacher_scores(tmp_path / "teacher_scores.jsonl")
    msg = str(err.value)
    assert "dpr-rerank teacher-scores model=<cross-encoder dir>" in msg and f"output={tmp_path}" in msg
    assert "score_candidates" not in msg and "\n" not in msg


def test_scores_of_other_data_name_the_command_that_rescores(tmp_path):
    train = tmp_path / "train.json"
    train.write_text(json.dumps([{"question": "q", "answers": ["a"], "positive_ctxs": [
        {"passage_id": "p1", "title": "", "text": "a"}], "hard_negative_ctxs": [
        {"passage_id": "p2", "title": "", "text": "b"}]}]))
    scores = tmp_path / "teacher_scores.jsonl"
    score_candidates(lambda qs, ctxs: [1.0] * len(ctxs), train, scores, teacher_fingerprint="t")
    assert manifest_path(scores).is_file()
    other = tmp_path / "other.json"
    other.write_text(train.read_text().replace('"q"', '"q2"'))
    with pytest.raises(DataError) as err:
        read_teacher_scores(scores, other)
    assert "rescore with dpr-rerank teacher-scores" in str(err.value) and "overwrite=True" not in str(err.value)
