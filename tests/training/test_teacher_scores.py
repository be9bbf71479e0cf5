"""The teacher-scores file (written, resumed, reused, refused when stale, validated), denoising with it,
and training with it: the scores reach masks.teacher and a distillation run learns."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from tests.conftest import add_tiny_hard_negatives, overlap_scorer, write_tiny_teacher_scores
from tests.training.helpers import train_batches
from hypothesis import given, settings
from hypothesis import strategies as st

from dpr.errors import DataError
from dpr.training.config import TrainConfig
from dpr.training.denoise import counts_path, denoise_examples, write_denoise_counts
from dpr.training.teacher import ScoreFileTeacher, prepare_teacher
from dpr.training.teacher_scores import (SCORES_FILE, ScoreRecord, TeacherScores, candidates_of, iter_records,
                                         manifest_path, parse_record, parts_dir, read_teacher_scores,
                                         score_candidates)

pytestmark = pytest.mark.usefixtures("one_thread")


class CountingScorer:
    """overlap_scorer that counts the pairs it was asked for, and can fail on its n-th call."""

    def __init__(self, fail_on_call: int | None = None) -> None:
        self.pairs, self.calls, self.fail_on_call = 0, 0, fail_on_call

    def __call__(self, questions, passages):
        self.calls += 1
        if self.fail_on_call == self.calls:
            raise KeyboardInterrupt("killed mid-run")
        self.pairs += len(passages)
        return overlap_scorer(questions, passages)


@pytest.fixture()
def tiny(tiny_data_dir) -> Path:
    root = tiny_data_dir / "tiny"
    add_tiny_hard_negatives(root)
    return root


def score(root: Path, scorer=overlap_scorer, **kw) -> dict:
    kw.setdefault("teacher_fingerprint", "test:overlap")
    return score_candidates(scorer, root / "train.json", root / SCORES_FILE, **kw)


# ---------------------------------------------------------------- the file


def test_scores_file_holds_every_questions_candidates_and_their_scores(tiny):
    manifest = score(tiny, chunk_size=3)
    examples = json.loads((tiny / "train.json").read_text())
    records = list(iter_records(tiny / SCORES_FILE))
    assert [r.index for r in records] == list(range(len(examples))) == list(range(manifest["questions"]))
    for ex, rec in zip(examples, records):
        cands = candidates_of(ex)
        assert rec.question == ex["question"]
        assert rec.passage_ids == [c["passage_id"] for c in cands] and len(cands) == 4  # positive + 3 hard
        assert rec.scores == pytest.approx(overlap_scorer([ex["question"]] * 4, cands))
    assert manifest["pairs"] == 4 * len(examples) and manifest["teacher"] == "test:overlap"
    assert json.loads(manifest_path(tiny / SCORES_FILE).read_text()) == manifest
    assert not parts_dir(tiny / SCORES_FILE).exists()  # the chunks are gone once the file is finished
    assert len(candidates_of(examples[0], max_negatives=1)) == 2


def test_reused_when_up_to_date(tiny):
    first = score(tiny)
    before = (tiny / SCORES_FILE).stat().st_mtime_ns
    scorer = CountingScorer()
    assert score(tiny, scorer) == first
    assert scorer.calls == 0 and (tiny / SCORES_FILE).stat().st_mtime_ns == before


@pytest.mark.parametrize("change,field", [("teacher", "teacher"), ("candidates", "candidates"), ("data", "data")])
def test_refused_when_stale_and_rescored_with_overwrite(tiny, change, field):
    score(tiny)
    kw = {}
    if change == "teacher":
        kw["teacher_fingerprint"] = "test:another-teacher"
    elif change == "candidates":
        kw["max_negatives"] = 2
    else:  # the data changed (another question text), the candidates with it
        examples = json.loads((tiny / "train.json").read_text())
        examples[0]["answers"] = ["Honolulu", "HNL"]  # same candidates, other data
        (tiny / "train.json").write_text(json.dumps(examples))
    scorer = CountingScorer()
    with pytest.raises(DataError, match=f"field '{field}': stale") as err:
        score(tiny, scorer, **kw)
    assert "\n" not in str(err.value) and scorer.calls == 0
    new = score(tiny, scorer, overwrite=True, **kw)
    assert scorer.pairs == new["pairs"] > 0
    assert score(tiny, CountingScorer(), **kw) == new  # and now up to date


def test_a_killed_run_resumes_from_its_finished_chunks(tiny):
    reference = score(tiny, chunk_size=3)
    ref_text = (tiny / SCORES_FILE).read_text()
    for p in (tiny / SCORES_FILE, manifest_path(tiny / SCORES_FILE)):
        p.unlink()
    killed = CountingScorer(fail_on_call=3)  # chunks of 3 questions: the first two are written, then it dies
    with pytest.raises(KeyboardInterrupt):
        score(tiny, killed, chunk_size=3)
    assert not (tiny / SCORES_FILE).exists() and not manifest_path(tiny / SCORES_FILE).exists()
    assert len(list(parts_dir(tiny / SCORES_FILE).glob("chunk_*.jsonl"))) == 2
    resumed = CountingScorer()
    assert score(tiny, resumed, chunk_size=3) == reference
    assert resumed.calls == 1 and resumed.pairs == 2 * 4  # only the last chunk (2 questions x 4 candidates)
    assert (tiny / SCORES_FILE).read_text() == ref_text
    # chunks of another teacher are refused, not mixed in
    for p in (tiny / SCORES_FILE, manifest_path(tiny / SCORES_FILE)):
        p.unlink()
    with pytest.raises(KeyboardInterrupt):
        score(tiny, CountingScorer(fail_on_call=2), chunk_size=3)
    with pytest.raises(DataError, match="field 'teacher': stale"):
        score(tiny, CountingScorer(), chunk_size=3, teacher_fingerprint="test:other")


def test_scorer_output_is_checked(tiny):
    with pytest.raises(ValueError, match="returned 1 scores for 32"):
        score(tiny, lambda q, p: [0.0])
    with pytest.raises(ValueError, match="non-finite score to question 0"):
        score(tiny, lambda q, p: [math.nan] * len(p))
    assert not manifest_path(tiny / SCORES_FILE).exists()


def test_reader_refuses_an_edited_file_and_scores_of_other_data(tiny):
    score(tiny)
    assert read_teacher_scores(tiny / SCORES_FILE, tiny / "train.json").score("what is the capital of hawaii", "p1") \
        == pytest.approx(overlap_scorer(["what is the capital of hawaii"], [candidates_of(
            json.loads((tiny / "train.json").read_text())[0])[0]])[0])
    with pytest.raises(DataError, match="field 'data'"):
        read_teacher_scores(tiny / SCORES_FILE, tiny / "dev.json")
    text = (tiny / SCORES_FILE).read_text()
    (tiny / SCORES_FILE).write_text(text.replace('"scores": [', '"scores": [1', 1))
    with pytest.raises(DataError, match="changed since"):
        read_teacher_scores(tiny / SCORES_FILE)


# ---------------------------------------------------------------- the reader's record validation

ids_st = st.lists(st.text(min_size=1, max_size=6), max_size=5, unique=True)
record_st = ids_st.flatmap(lambda ids: st.builds(
    ScoreRecord, index=st.integers(0, 10 ** 6), question=st.text(max_size=20), passage_ids=st.just(ids),
    scores=st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=len(ids),
                    max_size=len(ids))))


@settings(max_examples=150, deadline=None)
@given(rec=record_st)
def test_records_round_trip(rec):
    assert parse_record(rec.as_json(), "s.jsonl", 1) == rec


BAD_FIELDS = {
    "index": [-1, "3", 1.5, True, None],
    "question": [3, None, ["q"]],
    "passage_ids": ["p1", [1], None, ["a", "a"]],
    "scores": ["1", [True], None, [1.0, 2.0, 3.0], [float("nan")], [float("inf")]],
}


@settings(max_examples=150, deadline=None)
@given(rec=record_st, line=st.integers(1, 10 ** 5), data=st.data())
def test_a_malformed_record_names_file_line_and_field(rec, line, data):
    field = data.draw(st.sampled_from(sorted(BAD_FIELDS)))
    value = data.draw(st.sampled_from(BAD_FIELDS[field]))
    obj = json.loads(rec.as_json())
    if field == "scores" and value == [1.0, 2.0, 3.0] and len(rec.passage_ids) == 3:
        value = [1.0]  # the wrong length for this record
    obj[field] = value
    with pytest.raises(DataError) as err:
        parse_record(json.dumps(obj), "s.jsonl", line)  # NaN and Infinity as Python's json writes them
    assert str(err.value).startswith(f"s.jsonl:{line}: field '{field}': ") and "\n" not in str(err.value)


@pytest.mark.parametrize("text,needle", [("{", "not valid JSON"), ("[1]", "expected a JSON object"),
                                         ('{"index": 0}', "field 'question': missing"),
                                         ('{"index": 0, "question": "", "passage_ids": [], "scores": [], "x": 1}',
                                          "field 'x': unknown")])
def test_reader_names_the_line_of_broken_json(text, needle):
    with pytest.raises(DataError, match=needle) as err:
        parse_record(text, "s.jsonl", 7)
    assert str(err.value).startswith("s.jsonl:7")


def test_records_out_of_order_are_refused(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(ScoreRecord(0, "q", [], []).as_json() + "\n" + ScoreRecord(2, "q", [], []).as_json() + "\n")
    with pytest.raises(DataError, match="s.jsonl:2: field 'index'"):
        list(iter_records(path))


# ---------------------------------------------------------------- denoising


def store_of(rows: dict) -> TeacherScores:
    return TeacherScores(Path("x/teacher_scores.jsonl"), {"teacher": "t", "data": "d"}, rows)


def _ctx(pid):
    return {"passage_id": pid, "title": "", "text": pid}


def test_denoising_drops_exactly_the_negatives_above_its_threshold(tmp_path):
    # positive scored 5.0; margin 1.0 -> threshold 4.0: 6.0 (above the positive) and 4.5 (within the margin)
    # are dropped; 4.0 (at the threshold) and 1.0 kept; n5 unscored kept
    ex = {"question": "q", "answers": [], "positive_ctxs": [_ctx("p")],
          "hard_negative_ctxs": [_ctx("n1"), _ctx("n2"), _ctx("n3"), _ctx("n5")], "negative_ctxs": [_ctx("n4")]}
    other = {"question": "unscored q", "answers": [], "positive_ctxs": [_ctx("p")],
             "hard_negative_ctxs": [_ctx("n1")], "negative_ctxs": []}
    store = store_of({"q": {"p": 5.0, "n1": 6.0, "n2": 4.5, "n3": 4.0, "n4": 1.0}, "unscored q": {"n1": 9.0}})
    out, counts = denoise_examples([ex, other], store, margin=1.0)
    assert [c["passage_id"] for c in out[0]["hard_negative_ctxs"]] == ["n3", "n5"]
    assert [c["passage_id"] for c in out[0]["negative_ctxs"]] == ["n4"]
    assert out[1] == other  # no scored positive: nothing to compare with
    assert counts == {"questions": 2, "examined": 4, "kept": 2, "dropped_above_positive": 1,
                      "dropped_within_margin": 1, "unscored": 1, "questions_without_positive_score": 1}
    assert ex["hard_negative_ctxs"][0]["passage_id"] == "n1"  # the input is not modified
    # margin 0: only what scores above the positive goes
    out, counts = denoise_examples([ex], store, margin=0.0)
    assert [c["passage_id"] for c in out[0]["hard_negative_ctxs"]] == ["n2", "n3", "n5"]
    with pytest.raises(ValueError, match="teacher_denoise_margin"):
        denoise_examples([ex], store, margin=-1)
    store.path = tmp_path / "teacher_scores.jsonl"
    path = write_denoise_counts(store, 0.0, counts)
    assert path == counts_path(store.path) == tmp_path / "teacher_scores.denoise.json"
    assert json.loads(path.read_text())["counts"] == counts


def test_denoising_in_a_run_writes_its_counts_beside_the_scores(tiny):
    score(tiny)
    examples = json.loads((tiny / "train.json").read_text())
    tc = TrainConfig(teacher_denoise=True, teacher_denoise_margin=0.5)
    run = prepare_teacher(object(), tc, tiny, tiny / "passages.tsv", tiny / "train.json", examples)
    assert run.teacher is None and run.fingerprint["teacher_scores"]["teacher"] == "test:overlap"
    counts = json.loads((tiny / "teacher_scores.denoise.json").read_text())["counts"]
    kept = sum(len(ex["hard_negative_ctxs"]) for ex in run.examples)
    assert kept == counts["kept"] and counts["examined"] == 3 * len(examples)
    assert counts["dropped_above_positive"] + counts["dropped_within_margin"] == counts["examined"] - kept


def test_a_scores_loss_draws_its_hard_negatives_among_the_scored_ones(tmp_path):
    from dpr.training.teacher import keep_scored_negatives

    store = TeacherScores(tmp_path / SCORES_FILE, {}, {"q1": {"p": 3.0, "n2": 1.0, "n4": 0.5}, "q2": {"p2": 1.0}})
    ex1 = {"question": "q1", "positive_ctxs": [{"passage_id": "p"}],
           "hard_negative_ctxs": [{"passage_id": f"n{i}"} for i in range(1, 6)]}
    ex2 = {"question": "q2", "positive_ctxs": [{"passage_id": "p2"}], "hard_negative_ctxs": [{"passage_id": "m1"}]}
    out = keep_scored_negatives([ex1, ex2], store)
    assert [c["passage_id"] for c in out[0]["hard_negative_ctxs"]] == ["n2", "n4"]  # mined order kept
    assert out[1] == ex2  # no scored negative: its mined list stays
    assert len(ex1["hard_negative_ctxs"]) == 5  # the input is not modified
    assert TrainConfig().teacher_scored_negatives is True


def test_prepare_teacher_keeps_only_scored_negatives_for_a_scores_loss(tiny):
    from dpr.losses import KLDistillLoss, SoftmaxNLLLoss

    score(tiny, max_negatives=1)
    examples = json.loads((tiny / "train.json").read_text())
    args = (tiny, tiny / "passages.tsv", tiny / "train.json", examples)
    run = prepare_teacher(KLDistillLoss(), TrainConfig(), *args)
    assert all(len(ex["hard_negative_ctxs"]) == 1 for ex in run.examples)
    assert [ex["hard_negative_ctxs"][0] for ex in run.examples] == [ex["hard_negative_ctxs"][0] for ex in examples]
    run = prepare_teacher(KLDistillLoss(), TrainConfig(teacher_scored_negatives=False), *args)
    assert run.examples == examples
    run = prepare_teacher(SoftmaxNLLLoss(), TrainConfig(), *args)  # no teacher: nothing changes
    assert run.examples == examples


# ---------------------------------------------------------------- training with the scores


def test_batches_carry_each_questions_own_scores_and_nan_elsewhere(tiny):
    score(tiny)
    store = read_teacher_scores(tiny / SCORES_FILE)
    examples = json.loads((tiny / "train.json").read_text())
    batches = train_batches(examples, None, batch_size=4, hard_negatives=2, question_max_length=8,
                           passage_max_length=8, seed=1, teacher=ScoreFileTeacher(store), mask_answers=False)
    everyone = batches.global_items(0, 0)
    questions = [it.as_question() for it in everyone]
    masks = batches.masks(everyone, questions)
    ids = [c["passage_id"] for it in everyone for c in it.passages]
    assert masks.teacher.shape == masks.positive.shape == (4, len(ids))
    for i, q in enumerate(questions):
        own = store.by_question[q["question"]]
        for j, pid in enumerate(ids):
            got = masks.teacher[i, j].item()
            if pid in own:  # every column of a scored passage, wherever in the pool it sits
                assert got == pytest.approx(own[pid])
            else:
                assert math.isnan(got)
        assert not math.isnan(masks.teacher[i, i * 3].item())  # its own positive is scored
    # the pool has other questions' passages the teacher never scored for this question
    assert torch.isnan(masks.teacher).any()


def test_a_loss_that_needs_scores_without_a_file_is_one_clear_error(tiny):
    from dpr.losses import KLDistillLoss

    with pytest.raises(FileNotFoundError, match="teacher_scores.jsonl: no teacher scores, which loss kl_distill"):
        prepare_teacher(KLDistillLoss(), TrainConfig(), tiny, tiny / "passages.tsv", tiny / "train.json", [])


def test_tiny_kl_distill_training_with_a_scores_file_learns(tiny_model_dir, tiny_data_dir, tmp_path):
    from dpr.trainkit.metrics_log import read_jsonl
    from dpr.training.train import train

    write_tiny_teacher_scores(tiny_data_dir / "tiny")
    out = tmp_path / "run"
    cfg = {
        "model": {"name": str(tiny_model_dir), "pooling": "mean", "question_max_length": 32, "passage_max_length": 64},
        "data": {"name": "tiny", "kind": "qa"},
        "loss": {"_target_": "dpr.losses.KLDistillLoss", "nll_weight": 0.0},
        "train": {"batch_size": 4, "hard_negatives": 3, "max_steps": 12, "lr": 3e-3, "warmup_ratio": 0.0,
                  "print_every": 1000, "validate": False, "save_every": 0, "precision": "fp32",
                  "shuffle": False, "shuffle_hard_negatives": False, "teacher_denoise": True},
        "logger": {"type": "none"}, "data_dir": str(tiny_data_dir), "output_dir": str(out), "seed": 7,
    }
    summary = train(cfg)
    losses = [r["loss"] for r in read_jsonl(out / "metrics.jsonl")]
    assert len(losses) == 12 and all(math.isfinite(v) for v in losses)
    # each batch is seen 6 times (2 batches, no shuffling): the KL to the teacher falls
    assert sum(losses[-2:]) < 0.7 * sum(losses[:2]), losses
    assert summary["steps"] == 12
    assert (tiny_data_dir / "tiny" / "teacher_scores.denoise.json").is_file()


def test_each_rank_gets_its_rows_of_the_one_process_teacher_scores(tiny):
    """Under DDP every rank builds its questions' rows against the global pool from the same file: the
    ranks' rows stacked are the single process's scores (NaNs at the same places)."""
    score(tiny)
    teacher = ScoreFileTeacher(read_teacher_scores(tiny / SCORES_FILE))
    examples = json.loads((tiny / "train.json").read_text())

    def rows(rank, world):
        b = train_batches(examples, None, batch_size=4 // world, hard_negatives=2, question_max_length=8,
                         passage_max_length=8, seed=1, rank=rank, world_size=world, teacher=teacher,
                         mask_answers=False)
        everyone = b.global_items(0, 1)
        return b.masks(everyone, [it.as_question() for it in b.items(0, 1)]).teacher

    one = rows(0, 1)
    two = torch.cat([rows(0, 2), rows(1, 2)])
    assert one.shape == two.shape == (4, 12)
    assert torch.equal(torch.isnan(one), torch.isnan(two))
    assert torch.equal(torch.nan_to_num(one), torch.nan_to_num(two)) and not torch.isnan(one).all()


def test_prepare_teacher_picks_the_teacher_the_loss_declares(tiny):
    from dpr.losses import LexicalDistillLoss, MarginMSELoss
    from dpr.training.teacher import BM25Teacher

    score(tiny)
    args = (tiny, tiny / "passages.tsv", tiny / "train.json", [])
    assert isinstance(prepare_teacher(LexicalDistillLoss(), TrainConfig(), *args).teacher, BM25Teacher)
    run = prepare_teacher(MarginMSELoss(), TrainConfig(teacher_scores=str(tiny / SCORES_FILE)), *args)
    assert isinstance(run.teacher, ScoreFileTeacher) and run.fingerprint["teacher_scores"]["data"].startswith("sha256:")
    assert prepare_teacher(object(), TrainConfig(), *args) == (None, [], {})  # no teacher, no file read
    odd = type("Odd", (), {"teacher": "oracle"})()
    with pytest.raises(ValueError, match="'oracle' teacher; known: bm25, scores"):
        prepare_teacher(odd, TrainConfig(), *args)
