"""scripts/interpolate_weights.py: WiSE-FT interpolation between the start model and a trained run, scored on dev."""

from __future__ import annotations

import json

import pytest
import torch

from tests.scripts import script


def test_interpolate_is_a_weighted_mean_and_writes_nothing_back():
    trained = {"w": torch.tensor([2.0, 4.0]), "ids": torch.tensor([0, 1])}
    start = {"w": torch.tensor([0.0, 1.0]), "ids": torch.tensor([0, 1])}
    out = script("interpolate_weights").interpolate(trained, start, 0.25)
    assert torch.allclose(out["w"], torch.tensor([0.5, 1.75])) and torch.equal(out["ids"], trained["ids"])
    assert torch.equal(trained["w"], torch.tensor([2.0, 4.0])) and torch.equal(start["w"], torch.tensor([0.0, 1.0]))
    out["ids"][0] = 5  # a copy, not the trained model's buffer
    assert trained["ids"][0] == 0
    with pytest.raises(ValueError, match="differ"):
        script("interpolate_weights").interpolate(trained, {"w": start["w"]}, 0.5)


def test_the_ends_score_the_trained_and_the_start_model(tiny_model_dir, tiny_data_dir, tmp_path):
    from dpr.models.io import build_biencoder, save_biencoder
    from dpr.models.biencoder import BiEncoderConfig
    from dpr.training.batching import load_examples
    from dpr.training.validation import DevEncoding, load_corpus, validate

    cfg = BiEncoderConfig(name=str(tiny_model_dir), similarity="cosine", temperature=0.05, passage_max_length=64)
    torch.manual_seed(0)
    start, tok = build_biencoder(cfg)
    trained, _ = build_biencoder(cfg)
    with torch.no_grad():  # "training": move every weight
        for p in trained.parameters():
            p.add_(0.5 * torch.randn_like(p))
    run = save_biencoder(trained, tok, tmp_path / "model")
    out = tmp_path / "interp.json"
    assert script("interpolate_weights").main(["--model", str(run), "--data-dir", str(tiny_data_dir), "--data", "tiny",
                           "--alphas", "1,0", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["alpha"] for r in rows] == [1.0, 0.0]
    dev = load_examples(tiny_data_dir / "tiny" / "dev.json")
    corpus = load_corpus(tiny_data_dir / "tiny" / "passages.tsv")
    for row, model in zip(rows, (trained, start)):
        want = validate(model, tok, dev, corpus=corpus, use_answers=True, cfg={},
                        encoding=DevEncoding(question_max_length=64, passage_max_length=64, autocast="off"))
        assert row["avg_rank"] == pytest.approx(want["avg_rank"]) and row["mrr"] == pytest.approx(want["mrr"], abs=1e-6)
        assert row["top1"] == want["top1"] and row["top5"] == want["top5"]
    # the two ends differ (the test would not tell them apart otherwise)
    assert (rows[0]["mrr"], rows[0]["avg_rank"]) != (rows[1]["mrr"], rows[1]["avg_rank"])


def test_the_runs_own_validation_settings_are_used(tiny_model_dir, tiny_data_dir, tmp_path):
    """A run validated on its first 2 dev questions without corpus top-k is scored the same way."""
    from dpr.models.biencoder import BiEncoderConfig
    from dpr.models.io import build_biencoder, save_biencoder

    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), passage_max_length=64))
    run = save_biencoder(model, tok, tmp_path / "model")
    (run / "train_summary.json").write_text(json.dumps(
        {"config": {"train": {"val_max_questions": 2, "val_corpus_topk": False}}}))
    out = tmp_path / "interp.json"
    script("interpolate_weights").main(["--model", str(run), "--data-dir", str(tiny_data_dir), "--data", "tiny", "--alphas", "1",
                    "--out", str(out)])
    row = json.loads(out.read_text())["rows"][0]
    assert row["num_questions"] == 2 and "top1" not in row
