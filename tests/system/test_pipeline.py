"""The whole pipeline end to end on a tiny random model and a tiny corpus, through the console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.run_command import run_as_subprocess

BIN = Path(sys.executable).parent

# Dev questions that differ from every test question and mislead BM25: each one's words match one
# passage while its answer sits in another. On dev, fusing in BM25 only hurts (the dev-tuned weight is
# small); on test (the tiny set's own questions) BM25 is nearly perfect (a test-tuned weight is large).
# A pipeline that tuned on test, or on both, would land on another weight than the one checked below.
DEV_QA = [
    ("mitochondria powerhouse cell atp", ["Everest"], "p4"),
    ("photosynthesis light energy plants", ["Pacific"], "p6"),
    ("water boils degrees celsius", ["Honolulu"], "p1"),
    ("pacific ocean largest deepest", ["Photosynthesis"], "p5"),
]


def _distinct_dev(root: Path) -> None:
    """Rewrite ``dev.json``/``dev.qa.tsv`` of a tiny dataset with DEV_QA (dev ∩ test = ∅)."""
    from tests.conftest import TINY_PASSAGES

    by_id = {pid: (text, title) for pid, text, title in TINY_PASSAGES}
    dev = [{"question": q, "answers": a, "positive_ctxs": [{"passage_id": pid, "title": by_id[pid][1],
                                                             "text": by_id[pid][0]}],
            "negative_ctxs": [], "hard_negative_ctxs": []} for q, a, pid in DEV_QA]
    (root / "dev.json").write_text(json.dumps(dev, indent=1), encoding="utf-8")
    (root / "dev.qa.tsv").write_text("".join(f"{q}\t{json.dumps(a)}\n" for q, a, _ in DEV_QA), encoding="utf-8")


def _pipeline(tiny_data_dir: Path, tiny_model_dir: Path, out: Path, *extra: str,
              in_process: bool = False) -> subprocess.CompletedProcess:
    """The tiny run through the console script: a process, or its main in-process (``in_process=True``: refusals,
    runs whose checks read the run directory, and reruns of a run a process recorded; each test that reruns starts
    its first run as a process, so a stage record bound to the process that wrote it fails the rerun's checks)."""
    cmd = [
        str(BIN / "dpr-pipeline"), "data.name=tiny", "data.kind=qa", "data.recipe=none",
        f"data_dir={tiny_data_dir}", f"output_dir={out}", f"model.name={tiny_model_dir}",
        "model.shared=false", "model.pooling=cls", "model.similarity=dot", "model.temperature=1.0",
        "train.max_steps=4", "train.batch_size=4", "train.hard_negatives=1", "train.save_every=0",
        "train.val_max_questions=4", "train.lr=1e-3", "train.frozen_steps=2", "bm25.num_negatives=3", "retrieve.k=5",
        "encode.batch_size=4", *extra,
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    if in_process:
        return run_as_subprocess(cmd, env=env)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
@pytest.mark.precision  # the export's runtime follows auto's precision rule: runs under both rules in .ci/run
def test_pipeline_end_to_end_and_skips_up_to_date_stages(tiny_data_dir, tiny_model_dir, tmp_path):
    from dpr.data.qa import read_qa_tsv

    root = tiny_data_dir / "tiny"
    _distinct_dev(root)
    dev_q = {p.question for p in read_qa_tsv(root / "dev.qa.tsv")}
    assert dev_q and not dev_q & {p.question for p in read_qa_tsv(root / "test.qa.tsv")}
    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, "hybrid.metric_k=1")
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
    _check_hybrid_weight_from_dev(out)
    _check_mined_negatives(root)
    _check_export_is_the_trainers_vectors(out, root)
    timings = json.loads((out / "timings.json").read_text())
    assert {"bm25_retrieve", "bm25_mine", "train", "dense_encode", "hybrid"} <= set(timings["seconds"])
    assert timings["skipped"] == []

    # second run (in this process: what another process recorded must hold): everything up to date and says so
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, "hybrid.metric_k=1", in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    skipped = json.loads((out / "timings.json").read_text())["skipped"]
    assert {"bm25_retrieve", "train", "dense_encode", "dense_index", "hybrid"} <= set(skipped)
    assert "up to date" in proc.stdout + proc.stderr

    # third run, the run directory moved (a rename keeps mtimes): still every stage up to date
    ran = set(timings["seconds"]) - {"prepare", "total"}
    moved = tmp_path / "moved" / "run"
    moved.parent.mkdir()
    out.rename(moved)
    proc = _pipeline(tiny_data_dir, tiny_model_dir, moved, "hybrid.metric_k=1", in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert set(json.loads((moved / "timings.json").read_text())["skipped"]) == ran


def _check_hybrid_weight_from_dev(out: Path) -> None:
    """The saved weight is the one tuned on the dev result files, and a test-tuned weight differs (so the
    check can tell them apart); the hybrid test results are the test lists fused with that weight."""
    from dpr.retrieval.fusion import fuse_linear, tune_linear_weight

    saved = json.loads((out / "hybrid" / "weight.json").read_text())
    kw = {"metric": saved["metric"], "metric_k": saved["metric_k"], "normalize": saved["normalize"],
          "grid": [row["weight"] for row in saved["grid"]]}
    assert saved["metric_k"] == 1
    dev_w, _ = tune_linear_weight(out / "bm25" / "dev.json", out / "dense" / "dev.json", **kw)
    test_w, _ = tune_linear_weight(out / "bm25" / "test.json", out / "dense" / "test.json", **kw)
    assert saved["weight"] == dev_w
    assert test_w != dev_w, (dev_w, test_w)
    fused = fuse_linear(out / "bm25" / "test.json", out / "dense" / "test.json", dev_w, k=5,
                        normalize=saved["normalize"])
    written = json.loads((out / "hybrid" / "test.json").read_text())
    assert [[c["id"] for c in r["ctxs"]] for r in written] == [[c["id"] for c in r["ctxs"]] for r in fused]


def _check_mined_negatives(root: Path) -> None:
    """Mining wrote BM25 hard negatives into train and dev, none holding an answer or being a positive."""
    from dpr.eval.has_answer import has_answer

    for name in ("train.json", "dev.json"):
        examples = json.loads((root / name).read_text())
        assert any(ex["hard_negative_ctxs"] for ex in examples), name
        for ex in examples:
            positives = {c["passage_id"] for c in ex["positive_ctxs"]}
            for neg in ex["hard_negative_ctxs"]:
                assert neg["passage_id"] not in positives, (name, ex["question"], neg)
                assert not has_answer(ex["answers"], neg["text"]), (name, ex["question"], neg)


def test_pipeline_missing_dataset_is_one_line_error(tmp_path, tiny_model_dir):
    proc = run_as_subprocess(
        [str(BIN / "dpr-pipeline"), "data.name=nothing", "data.recipe=none", f"data_dir={tmp_path}",
         f"output_dir={tmp_path / 'run'}", f"model.name={tiny_model_dir}"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    assert "passages.tsv" in proc.stderr and "Traceback" not in proc.stderr


def _qrels_dataset(root: Path) -> Path:
    """The tiny corpus as BEIR-style qrels data: queries.jsonl + qrels/{train,dev,test}.tsv, no answers."""
    from tests.conftest import TINY_QA, write_tiny_dataset

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


@pytest.mark.slow
def test_pipeline_on_qrels_data_reports_qrels_metrics(tiny_model_dir, tmp_path):
    data_dir = tmp_path / "data"
    _qrels_dataset(data_dir / "tiny")
    out = tmp_path / "run"
    proc = _pipeline(data_dir, tiny_model_dir, out, "data.kind=qrels", in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "eval" / "report.json").read_text())
    assert {"bm25", "dense_untrained", "dense", "hybrid"} <= set(report["systems"])
    for metrics in report["systems"].values():
        assert 0.0 <= metrics["ndcg@10"] <= 1.0 and 0.0 <= metrics["mrr@10"] <= 1.0
    # every query has exactly one relevant passage among 8 and BM25 finds it: recall@100 is 1
    assert report["systems"]["bm25"]["recall@100"] == 1.0
    assert (out / "bm25" / "test.trec").is_file()


def _check_export_is_the_trainers_vectors(out: Path, root: Path) -> None:
    """The trained model's export was stored from training's last validation, not encoded again, where the
    export runs what training validated with (torch); where ``runtime: auto`` picks ONNX Runtime (fp32 on an
    AVX-512 CPU: no native bf16, or ``DPR_NO_BF16``) the vectors are not what it computes, so it encodes them
    itself. Either way the export holds what encoding the saved model gives (float16 storage; another batch size)."""
    import numpy as np

    from tests.encode_kw import encode_corpus  # the keyword form: settings split into EncodeConfig
    from dpr.index.shards import read_embeddings
    from dpr.models.onnx_runtime import resolve_runtime

    manifest = json.loads((out / "dense" / "embeddings" / "shard_000_of_001.json").read_text())
    runtime = resolve_runtime("auto", "cpu", "auto")
    assert manifest.get("runtime", "torch") == runtime
    assert manifest.get("reused_from") == ("training validation" if runtime == "torch" else None)
    ids, stored = read_embeddings(out / "dense" / "embeddings")
    fresh_ids, fresh = read_embeddings(encode_corpus(out / "model", root / "passages.tsv", out / "fresh",
                                                     batch_size=3, progress=False))
    assert ids == fresh_ids
    np.testing.assert_allclose(stored, fresh, atol=2e-3)
