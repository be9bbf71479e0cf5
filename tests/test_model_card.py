"""Model cards: the report's figures and the training config in the card, valid YAML metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpr.data.results import write_results
from dpr.model_card import read_card_metadata, write_model_card

from tests.conftest import TINY_QA, write_tiny_dataset


def _results(hit_rank: dict[int, int | None]) -> list[dict]:
    """Results whose question i has its answer at rank hit_rank[i] (None: nowhere in the top 20)."""
    out = []
    for i, (q, answers, _) in enumerate(TINY_QA):
        ctxs = [{"id": f"x{j}", "title": "", "text": "nothing", "score": 20.0 - j, "has_answer": False}
                for j in range(20)]
        rank = hit_rank.get(i)
        if rank is not None:
            ctxs[rank - 1] = {**ctxs[rank - 1], "text": f"it is {answers[0]}", "has_answer": True}
        out.append({"question": q, "answers": answers, "ctxs": ctxs})
    return out


@pytest.fixture()
def run_with_report(tiny_model_dir, tmp_path):
    """<out>/model (a run with train_summary.json) and <out>/eval (report.json, topk.png), as the pipeline lays them."""
    import torch

    from dpr.eval.report import evaluate_qa
    from dpr.models import BiEncoderConfig, build_biencoder, save_biencoder

    out = tmp_path / "runs" / "tiny"
    data_dir = tmp_path / "data"
    write_tiny_dataset(data_dir / "tiny")
    torch.manual_seed(0)
    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), similarity="cosine"))
    save_biencoder(model, tok, out / "model")
    summary = {"steps": 120, "epoch": 1, "precision": "bf16", "world_size": 2, "train_seconds": 600.0,
               "final_weights": "best (step 100, avg_rank=3.2)",
               "config": {"data": {"name": "tiny"}, "data_dir": str(data_dir), "seed": 42,
                          "train": {"batch_size": 16, "hard_negatives": 1, "lr": 2e-5, "warmup_ratio": 0.1,
                                    "grad_accumulation_steps": 1, "grad_cache_chunk_size": 0,
                                    "multi_positive": "auto"}},
               "resolved": {"multi_positive": False, "best_metric": "avg_rank"}}
    (out / "model" / "train_summary.json").write_text(json.dumps(summary))
    # bm25 finds 4 of 8 at rank 1; dense 6 of 8 within the top 5 (2 at rank 1)
    write_results(out / "bm25.json", _results({0: 1, 1: 1, 2: 1, 3: 1}))
    write_results(out / "dense.json", _results({0: 1, 1: 1, 2: 3, 3: 4, 4: 5, 5: 2}))
    report = evaluate_qa({"bm25": out / "bm25.json", "dense": out / "dense.json"}, out / "eval", ks=[1, 5, 20],
                         num_resamples=50)
    return out, report


def test_card_holds_the_report_and_training_config(run_with_report):
    out, report = run_with_report
    card = write_model_card(out / "model")  # the report is found at <run>/../eval/report.json
    text = card.read_text()
    assert report["systems"]["dense"]["top_k"]["5"] == 0.75 and report["systems"]["bm25"]["top_k"]["1"] == 0.5
    assert "| bm25 | 50.0 | 50.0 | 50.0 | +0.0 |" in text
    assert "| dense | 25.0 | 75.0 | 75.0 | +25.0 |" in text
    assert "![top-k curves](topk.png)" in text and (out / "model" / "topk.png").is_file()
    # training facts from train_summary.json and the dataset's size from its meta/train files
    for fact in ("| BM25 hard negatives per question | 1 |", "| precision | bf16 |", "| steps | 120 (epoch 1) |",
                 "16 questions per device x 2 device(s); 64 passages in the pool", "| examples seen | 3,840 |",
                 "Training data: `tiny`, 8 training questions.", "softmax cross-entropy",
                 "| every judged positive a positive | False |"):  # "auto" as the run resolved it
        assert fact in text, fact
    meta = read_card_metadata(card)
    assert meta["library_name"] == "transformers" and meta["datasets"] == ["tiny"]
    assert meta["metrics"] == ["top_1_accuracy", "top_5_accuracy", "top_20_accuracy"]
    results = meta["model-index"][0]["results"][0]
    assert {m["type"]: m["value"] for m in results["metrics"]} == {
        "top_1_accuracy": 25.0, "top_5_accuracy": 75.0, "top_20_accuracy": 75.0}
    assert results["dataset"]["split"] == "test"


def test_export_card_and_qrels_report(run_with_report, tmp_path):
    from dpr.data.beir import write_qrels
    from dpr.data.results import write_trec_run
    from dpr.eval.report import evaluate_qrels
    from dpr.export import export_sentence_transformers

    out, _ = run_with_report
    write_qrels(tmp_path / "qrels.tsv", {"q1": {"d1": 1}, "q2": {"d2": 2}})
    write_trec_run(tmp_path / "bm25.trec", {"q1": {"d1": 2.0, "d9": 1.0}, "q2": {"d9": 2.0, "d8": 1.0}})
    write_trec_run(tmp_path / "dense.trec", {"q1": {"d1": 2.0, "d9": 1.0}, "q2": {"d2": 2.0, "d8": 1.0}})
    report = evaluate_qrels({"bm25": tmp_path / "bm25.trec", "dense": tmp_path / "dense.trec"},
                            tmp_path / "qrels.tsv", tmp_path / "eval", num_resamples=50)
    export = export_sentence_transformers(out / "model", tmp_path / "st", report=tmp_path / "eval" / "report.json",
                                          model_name="tiny-retriever")
    text = (export / "README.md").read_text()
    ndcg = report["systems"]["dense"]["ndcg@10"]
    assert f"| dense | {ndcg:.4f} |" in text and "| bm25 | 0.5000 |" in text
    assert f"{ndcg - 0.5:+.4f}" in text and "# tiny-retriever" in text and "push_to_hub" in text
    meta = read_card_metadata(export / "README.md")
    assert meta["library_name"] == "sentence-transformers" and "sentence-transformers" in meta["tags"]
    assert meta["model-index"][0]["name"] == "tiny-retriever"
    assert {m["type"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}["ndcg_at_10"] == round(ndcg, 4)


def test_card_without_training_or_report(tiny_model_dir, tmp_path):
    from dpr.errors import DataError
    from dpr.models import BiEncoderConfig, build_biencoder, save_biencoder

    model, tok = build_biencoder(BiEncoderConfig(name="all-MiniLM-L6-v2"))
    save_biencoder(model, tok, tmp_path / "run")
    card = write_model_card(tmp_path / "run")
    meta = read_card_metadata(card)
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and "model-index" not in meta
    assert "No evaluation report yet" in card.read_text()
    (tmp_path / "bad.json").write_text('{"kind": "other"}')
    with pytest.raises(DataError, match="kind"):
        write_model_card(tmp_path / "run", report=tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError):
        write_model_card(tmp_path / "run", report=tmp_path / "missing.json")
