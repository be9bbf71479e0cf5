"""Re-mining rounds and frozen-index training through the pipeline, on a tiny random model."""

from __future__ import annotations

import json

from dpr.eval.has_answer import has_answer

from tests.system.test_pipeline import _pipeline


def test_two_rounds_remine_from_the_trained_model(tiny_data_dir, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, "train.rounds=2",
                     "train.corpus_negatives=true", "train.remine_negatives=3", "train.remine_relative_margin=0.0",
                     "train.remine_bm25_share=0.0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    seconds = json.loads((out / "timings.json").read_text())["seconds"]
    assert {"train_round1", "encode_round1", "index_round1", "remine_round2", "train_round2"} <= set(seconds)
    assert (out / "rounds" / "round1" / "model" / "biencoder.json").is_file()
    assert (out / "model" / "biencoder.json").is_file()  # the last round is the pipeline's model

    mined = json.loads((out / "rounds" / "round2" / "train.json").read_text())
    stats = json.loads((out / "rounds" / "round2" / "train.stats.json").read_text())
    assert stats["questions"] == len(mined) and stats["kept"] > 0
    for ex in mined:
        positives = {c["passage_id"] for c in ex["positive_ctxs"]}
        assert ex["hard_negative_ctxs"], ex["question"]
        for neg in ex["hard_negative_ctxs"]:
            assert neg["passage_id"] not in positives
            assert not has_answer(ex["answers"], neg["text"])
    summary = json.loads((out / "model" / "train_summary.json").read_text())
    assert summary["config"]["train_file"].endswith("round2/train.json")
    assert summary["config"]["model"]["name"].endswith("round1/model")  # round 2 continues from round 1
    rows = [json.loads(line) for line in (out / "model" / "metrics.jsonl").read_text().splitlines()]
    assert [r["frozen"] for r in rows] == [True, True, False, False, False, False]
    assert all("masked" in r for r in rows)


def test_until_train_stops_before_the_trained_model_meets_the_test_split(tiny_data_dir, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, "until=train")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "model" / "train_summary.json").is_file()  # the dev figures of the kept weights
    seconds = json.loads((out / "timings.json").read_text())["seconds"]
    assert "train" in seconds and not any(k.startswith(("dense_retrieve", "dense_encode", "hybrid")) for k in seconds)
    assert not (out / "dense").exists() and not (out / "eval").exists() and not (out / "hybrid").exists()

    bad = _pipeline(tiny_data_dir, tiny_model_dir, tmp_path / "bad", "until=eval")
    assert bad.returncode != 0 and "until must be null" in bad.stderr
    assert not (tmp_path / "bad" / "bm25").exists()  # refused before any work
