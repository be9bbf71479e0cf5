"""``dpr-data inspect``: its figures on a hand-built set equal a hand count; its warnings fire on bad sets only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dpr.atomic import write_json_atomic
from dpr.data.formats.scores import FILE_NAME, write_teacher_scores
from dpr.data.passages import write_passages
from dpr.data.retriever_json import write_retriever_json
from dpr.inspect import compute, dataset_warnings
from tests.run_command import run_as_subprocess

BIN = Path(sys.executable).parent
LONG = " ".join(["word"] * 30)
PASSAGES = {
    "p0": ("Hamlet", "x y"),
    "p1": ("Author", "written by Shakespeare"),
    "p2": ("Other", LONG),
    "p3": ("Dates", "a b"),
    "p4": ("France", LONG),
    "p5": ("Sky", "the sky"),
}


def ctx(pid: str) -> dict:
    title, text = PASSAGES[pid]
    return {"passage_id": pid, "title": title, "text": text}


def example(qid: str, q: str, answers: list[str], pos: list[str], hard: list[str]) -> dict:
    return {"question": q, "answers": answers, "positive_ctxs": [ctx(p) for p in pos], "negative_ctxs": [],
            "hard_negative_ctxs": [ctx(p) for p in hard], "query_id": qid}


def build(root: Path, train: list[dict], kind: str = "qa", scores: list[dict] | None = None) -> Path:
    root.mkdir(parents=True)
    write_passages(root / "passages.tsv", ((pid, text, title) for pid, (title, text) in PASSAGES.items()))
    write_retriever_json(root / "train.json", train)
    write_retriever_json(root / "dev.json", train[:1])
    write_json_atomic(root / "meta.json", {"name": root.name, "kind": kind})
    if scores is not None:
        write_teacher_scores(root / FILE_NAME, scores)
    return root


BAD_TRAIN = [
    example("a", "who wrote hamlet", ["Shakespeare"], ["p0"], ["p1", "p2"]),  # p1 contains the answer
    example("b", "when was hamlet written", ["1600"], ["p0"], ["p3"]),       # shares p0 with "a"
    example("c", "capital of france", ["Paris"], ["p4"], []),                # no negative
    example("d", "what colour is the sky", ["blue"], ["p5"], ["p5", "p2"]),  # p5 is its own positive
]
CFG = {"model": {"name": "all-MiniLM-L6-v2", "question_max_length": 64, "passage_max_length": 8},
       "train": {"batch_size": 2, "hard_negatives": 1}}


def test_figures_equal_a_hand_count(tmp_path):
    root = build(tmp_path / "bad", BAD_TRAIN, scores=[
        {"question": "who wrote hamlet", "query_id": "a", "split": "train", "passage_ids": ["p0", "p1", "p2"],
         "scores": [2.0, 1.0, 3.0]},
        {"question": "when was hamlet written", "query_id": "b", "split": "train", "passage_ids": ["p0", "p3"],
         "scores": [5.0, 0.0]}])
    r = compute(root, CFG)
    c = r["counts"]
    assert c["passages"] == 6 and c["questions"] == {"train": 4, "dev": 1}
    assert c["questions_without_negatives"] == 1 and c["questions_without_positives"] == 0
    assert c["hard_negatives_per_question"] == 5 / 4
    sp = r["shared_positives"]
    assert (sp["questions_sharing_a_positive"], sp["positives_shared"], sp["same_positive_pairs"]) == (2, 1, 1)
    assert sp["expected_colliding_pairs_per_batch"] == pytest.approx(1 * 2 * 1 / (4 * 3))
    fn = r["false_negatives"]
    assert (fn["mined_negatives"], fn["judged_relevant"], fn["contain_answer"]) == (5, 1, 1)
    assert fn["false_negative_rate"] == pytest.approx(2 / 5)
    # the two 30-word passages exceed 8 tokens; [CLS] title [SEP] x y [SEP] and the like do not
    assert r["passage_tokens"]["truncated"] == 2 and r["passage_tokens"]["share_truncated"] == pytest.approx(2 / 6)
    assert r["question_tokens"]["truncated"] == 0
    te = r["teacher"]
    assert te["pairs"] == 3 and te["share_positive_above"] == pytest.approx(2 / 3)  # margins 1, -1, 5
    assert (te["min"], te["max"]) == (0.0, 5.0) and te["margin_mean"] == pytest.approx(5 / 3)


def test_warnings_fire_on_a_bad_set_and_not_on_a_good_one(tmp_path):
    bad = build(tmp_path / "bad", BAD_TRAIN, scores=[
        {"question": "who wrote hamlet", "query_id": "a", "split": "train", "passage_ids": ["p0", "p1", "p2"],
         "scores": [0.0, 1.0, 3.0]}])  # the teacher ranks both negatives above the positive
    warnings = dataset_warnings(bad, CFG)
    assert dataset_warnings(bad, OmegaConf.create(CFG)) == warnings  # dpr-train hands its DictConfig
    text = "\n".join(warnings)
    assert len(warnings) == 4 and all(w.startswith("WARNING: ") for w in warnings)
    assert "25.0% of the training questions have no negative" in text and "threshold 10.0%" in text
    assert "40.0% of the mined negatives are false negatives" in text and "threshold 1.0%" in text
    assert "33.3% of the passages are longer than model.passage_max_length=8" in text and "threshold 5.0%" in text
    assert "only 0.0% of 2 pairs" in text
    good_train = [example("a", "who wrote hamlet", ["Shakespeare"], ["p0"], ["p3"]),
                  example("b", "what colour is the sky", ["blue"], ["p5"], ["p0"])]
    good = build(tmp_path / "good", good_train, scores=[
        {"question": "who wrote hamlet", "query_id": "a", "split": "train", "passage_ids": ["p0", "p3"],
         "scores": [3.0, 1.0]}])
    assert dataset_warnings(good, {**CFG, "model": {**CFG["model"], "passage_max_length": 64}}) == []
    # no hard negatives asked for: questions without negatives are no finding
    assert not any("no negative" in w for w in dataset_warnings(bad, {**CFG, "train": {"hard_negatives": 0}}))


def test_token_lengths_use_a_seeded_sample_of_the_corpus(tmp_path):
    root = build(tmp_path / "bad", BAD_TRAIN)
    a = compute(root, {**CFG, "inspect": {"max_passages": 3, "seed": 1}})
    b = compute(root, {**CFG, "inspect": {"max_passages": 3, "seed": 1}})
    assert a["counts"]["passages"] == 6 and a["passage_tokens"]["count"] == 3
    assert a["passage_tokens"]["lengths"] == b["passage_tokens"]["lengths"]
    with pytest.raises(ValueError, match="unknown inspect config keys"):
        compute(root, {**CFG, "inspect": {"max_pasages": 3}})


def test_qrels_judged_negatives_count_and_answers_do_not(tmp_path):
    train = [dict(example("a", "q", [], ["p0"], ["p1", "p2"]), qrels={"p0": 1, "p2": 2})]
    r = compute(build(tmp_path / "q", train, kind="qrels"), CFG)
    assert (r["false_negatives"]["judged_relevant"], r["false_negatives"]["contain_answer"]) == (1, 0)


def test_cli_writes_the_report(tmp_path):
    build(tmp_path / "prep" / "bad", BAD_TRAIN)
    proc = run_as_subprocess([str(BIN / "dpr-data"), "inspect", "data=bad", f"data_dir={tmp_path / 'prep'}",
                              "output=report", "model.passage_max_length=8", "train.batch_size=2"],
                             capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads((tmp_path / "report" / "inspect.json").read_text())
    assert rep["false_negatives"]["false_negative_rate"] == pytest.approx(0.4)
    assert "lengths" not in rep["passage_tokens"]
    assert (tmp_path / "report" / "inspect.png").read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "report" / "inspect.md").read_text()
    assert "WARNING: 40.0% of the mined negatives" in md
    assert "WARNING: 40.0% of the mined negatives" in proc.stdout + proc.stderr
    proc = run_as_subprocess([str(BIN / "dpr-data"), "inspect", "data=bad", f"data_dir={tmp_path / 'prep'}",
                              "output=report", "inspect.false_negative_max=abc"], capture_output=True, text=True,
                             cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "inspect.false_negative_max" in proc.stderr


def test_dpr_train_prints_the_same_warnings_at_start(tmp_path, tiny_model_dir):
    """``dpr-train`` logs what ``dpr-data inspect`` would warn about, before training (and trains on)."""
    import os
    import subprocess
    import sys

    data_dir = tmp_path / "prep"
    build(data_dir / "bad", BAD_TRAIN)
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "bad.yaml").write_text("name: bad\nkind: qa\n")
    env = dict(os.environ, WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    cmd = [str(Path(sys.executable).parent / "dpr-train"), "--config-dir", str(conf), "data=bad",
           f"data_dir={data_dir}", f"output_dir={tmp_path / 'run'}", "model=tiny", f"model.name={tiny_model_dir}",
           "model.passage_max_length=8", "train.max_steps=1", "train.batch_size=2", "train.hard_negatives=1",
           "train.val_batch_size=8", "train.precision=fp32"]
    proc = run_as_subprocess(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = proc.stdout + proc.stderr
    expected = dataset_warnings(data_dir / "bad", {"model": {"name": str(tiny_model_dir), "question_max_length": 32,
                                                            "passage_max_length": 8},
                                                  "train": {"batch_size": 2, "hard_negatives": 1}})
    assert expected and all(w in logged for w in expected)
    assert (tmp_path / "run" / "train_summary.json").is_file()  # a warning, not a refusal
