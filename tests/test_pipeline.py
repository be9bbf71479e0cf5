"""The whole pipeline end to end on a tiny random model and a tiny corpus, through the console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def _pipeline(tiny_data_dir: Path, tiny_model_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        str(BIN / "dpr-pipeline"), "data.name=tiny", "data.kind=qa", "data.recipe=none",
        f"data_dir={tiny_data_dir}", f"output_dir={out}", f"model.name={tiny_model_dir}",
        "model.shared=false", "model.pooling=cls", "model.similarity=dot", "model.temperature=1.0",
        "train.max_steps=4", "train.batch_size=4", "train.hard_negatives=1", "train.save_every=0",
        "train.val_max_questions=4", "train.lr=1e-3", "bm25.num_negatives=3", "retrieve.k=5",
        "encode.batch_size=4", *extra,
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def test_pipeline_end_to_end_and_skips_up_to_date_stages(tiny_data_dir, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out)
    assert proc.returncode == 0, proc.stderr[-3000:]

    report = json.loads((out / "eval" / "report.json").read_text())
    assert report["num_questions"] == 8
    assert {"bm25", "dense_untrained", "dense", "hybrid"} <= set(report["systems"])
    for system in report["systems"].values():
        top = system["top_k"]
        # accuracy never falls as k grows, and every question has 8 passages to find its answer in
        values = [top[k] for k in sorted(top, key=int)]
        assert values == sorted(values) and all(0.0 <= v <= 1.0 for v in values)
    # BM25 on this toy set finds nearly every answer first: the lexical overlap is total
    assert report["systems"]["bm25"]["top_k"]["1"] >= 0.75
    assert (out / "eval" / "report.md").is_file() and (out / "eval" / "topk.png").is_file()
    weight = json.loads((out / "hybrid" / "weight.json").read_text())["weight"]
    assert weight >= 0.0

    # mining wrote BM25 hard negatives into the training file, none holding an answer or a positive
    train = json.loads((tiny_data_dir / "tiny" / "train.json").read_text())
    assert any(ex["hard_negative_ctxs"] for ex in train)
    timings = json.loads((out / "timings.json").read_text())
    assert {"bm25_retrieve", "bm25_mine", "train", "dense_encode", "hybrid"} <= set(timings["seconds"])
    assert timings["skipped"] == []

    # second run: everything is up to date and says so
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    skipped = json.loads((out / "timings.json").read_text())["skipped"]
    assert {"bm25_retrieve", "train", "dense_encode", "dense_index", "hybrid"} <= set(skipped)
    assert "up to date" in proc.stdout + proc.stderr


def test_pipeline_missing_dataset_is_one_line_error(tmp_path, tiny_model_dir):
    proc = subprocess.run(
        [str(BIN / "dpr-pipeline"), "data.name=nothing", "data.recipe=none", f"data_dir={tmp_path}",
         f"output_dir={tmp_path / 'run'}", f"model.name={tiny_model_dir}"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    assert "passages.tsv" in proc.stderr and "Traceback" not in proc.stderr


def _qrels_dataset(root: Path) -> Path:
    """The tiny corpus as BEIR-style qrels data: queries.jsonl + qrels/{train,dev,test}.tsv, no answers."""
    from conftest import TINY_QA, write_tiny_dataset

    write_tiny_dataset(root)
    for name in ("test.qa.tsv", "dev.qa.tsv"):
        (root / name).unlink()
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": q}) + "\n" for i, (q, _, _) in enumerate(TINY_QA)), encoding="utf-8")
    (root / "qrels").mkdir()
    for split in ("train", "dev", "test"):
        rows = "".join(f"q{i}\t{pid}\t1\n" for i, (_, _, pid) in enumerate(TINY_QA))
        (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows, encoding="utf-8")
    for name in ("train.json", "dev.json"):
        examples = json.loads((root / name).read_text())
        for ex in examples:
            ex["answers"] = []
        (root / name).write_text(json.dumps(examples), encoding="utf-8")
    (root / "meta.json").write_text(json.dumps({"name": root.name, "kind": "qrels"}), encoding="utf-8")
    return root


def test_pipeline_on_qrels_data_reports_qrels_metrics(tiny_model_dir, tmp_path):
    data_dir = tmp_path / "data"
    _qrels_dataset(data_dir / "tiny")
    out = tmp_path / "run"
    proc = _pipeline(data_dir, tiny_model_dir, out, "data.kind=qrels")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "eval" / "report.json").read_text())
    assert {"bm25", "dense_untrained", "dense", "hybrid"} <= set(report["systems"])
    for metrics in report["systems"].values():
        assert 0.0 <= metrics["ndcg@10"] <= 1.0 and 0.0 <= metrics["mrr@10"] <= 1.0
    # every query has exactly one relevant passage among 8 and BM25 finds it: recall@100 is 1
    assert report["systems"]["bm25"]["recall@100"] == 1.0
    assert (out / "bm25" / "test.trec").is_file()
