"""Teacher scores that came with imported data become the project's teacher-scores file
(dpr.training.imported_scores), which distillation then reads unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpr.data.formats.scores import FILE_NAME
from dpr.data.retriever_json import read_retriever_json, write_retriever_json
from dpr.training.imported_scores import import_teacher_scores
from dpr.training.teacher_scores import SCORES_FILE, read_manifest, read_teacher_scores
from tests.data.test_formats_import import do_import, flag_rows, make_source

pytestmark = pytest.mark.usefixtures("one_thread")


def _flag(tmp_path: Path):
    return do_import("flagembedding", make_source(tmp_path, "flagembedding"), tmp_path / "prep", "flag")


def test_imported_scores_equal_the_files_and_are_fingerprinted(tmp_path):
    ds = _flag(tmp_path)
    out = import_teacher_scores(ds.root / FILE_NAME, ds.train)
    assert out == ds.root / SCORES_FILE
    store = read_teacher_scores(out, ds.train)
    rows = {r["query"]: r for r in flag_rows()}
    for ex in read_retriever_json(ds.train):  # each candidate's score is the one the source file gave it
        row = rows[ex["question"]]
        by_text = dict(zip(row["pos"] + row["neg"], row["pos_scores"] + row["neg_scores"]))
        for ctx in ex["positive_ctxs"] + ex["hard_negative_ctxs"]:
            assert store.score(ex["question"], ctx["passage_id"]) == pytest.approx(by_text[ctx["text"]])
    manifest = read_manifest(out)
    assert manifest["teacher"].startswith("imported:sha256:")
    mtime = out.stat().st_mtime_ns
    import_teacher_scores(ds.root / FILE_NAME, ds.train)  # up to date: reused, not rewritten
    assert out.stat().st_mtime_ns == mtime


def test_changed_imported_scores_rewrite_the_derived_file_but_never_another_teachers(tmp_path):
    ds = _flag(tmp_path)
    out = import_teacher_scores(ds.root / FILE_NAME, ds.train)
    lines = [json.loads(x) for x in (ds.root / FILE_NAME).read_text().splitlines()]
    lines[0]["scores"][0] += 1.0
    (ds.root / FILE_NAME).write_text("".join(json.dumps(x) + "\n" for x in lines))
    import_teacher_scores(ds.root / FILE_NAME, ds.train)
    q = next(ex for ex in read_retriever_json(ds.train) if ex["question"] == lines[0]["question"])
    pid = lines[0]["passage_ids"][0]
    assert read_teacher_scores(out, ds.train).score(q["question"], pid) == pytest.approx(lines[0]["scores"][0])
    # a file another teacher wrote is not the importer's to replace
    manifest = json.loads((ds.root / "teacher_scores.json").read_text())
    (ds.root / "teacher_scores.json").write_text(json.dumps({**manifest, "teacher": "sha256:cross-encoder"}))
    with pytest.raises(ValueError, match="teacher"):
        import_teacher_scores(ds.root / FILE_NAME, ds.train)


def test_a_candidate_without_an_imported_score_is_named(tmp_path):
    ds = _flag(tmp_path)
    exs = read_retriever_json(ds.train)
    have = {c["passage_id"] for c in exs[0]["positive_ctxs"] + exs[0]["hard_negative_ctxs"]}
    # another question's positive that question 0 was not scored against, as a miner might add it
    extra = next(c for ex in exs[1:] for c in ex["positive_ctxs"] if c["passage_id"] not in have)
    exs[0]["hard_negative_ctxs"].append(extra)
    write_retriever_json(ds.train, exs)
    with pytest.raises(ValueError, match=f"no imported score for question .* and passage '{extra['passage_id']}'"):
        import_teacher_scores(ds.root / FILE_NAME, ds.train)


def test_distillation_trains_on_an_imported_flagembedding_set(tmp_path, tiny_model_dir):
    """``dpr-train data=import data.name=<name> loss=kl_distill``: the imported scores are the teacher."""
    from omegaconf import OmegaConf

    from dpr.training.train import train

    ds = _flag(tmp_path)
    data = OmegaConf.to_container(OmegaConf.load(Path(__file__).parents[2] / "conf" / "data" / "import.yaml"))
    loss = OmegaConf.to_container(OmegaConf.load(Path(__file__).parents[2] / "conf" / "loss" / "kl_distill.yaml"))
    summary = train({
        "model": {"name": str(tiny_model_dir), "pooling": "mean", "question_max_length": 32, "passage_max_length": 64},
        "data": {**data, "name": "flag"}, "logger": {"type": "none"}, "loss": loss,
        "train": {"batch_size": 4, "hard_negatives": 2, "max_steps": 2, "print_every": 1000, "val_batch_size": 8,
                  "precision": "fp32", "save_every": 0},
        "data_dir": str(tmp_path / "prep"), "output_dir": str(tmp_path / "run"), "seed": 7})
    assert summary["steps"] == 2
    assert (ds.root / SCORES_FILE).is_file() and read_manifest(ds.root / SCORES_FILE)["teacher"].startswith("imported:")
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(m["loss"] == m["loss"] for m in metrics if "loss" in m)  # finite (not NaN)
