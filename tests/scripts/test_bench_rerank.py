"""scripts/bench_rerank.py on a tiny cross-encoder: the --json interface, and that the comparison is like for
like (in fp32 our scores are CrossEncoder.predict's, and our train step's loss is CrossEncoderTrainer's on
the same batches, step after step)."""

from __future__ import annotations

import json
import math

import pytest

from tests.scripts import script
from tests.scripts.test_bench_scripts import KEYS

pytest.importorskip("sentence_transformers")
pytest.importorskip("accelerate")  # CrossEncoderTrainer, the training peer, refuses to build without it

NEGATIVES = 2


@pytest.fixture()
def tiny_cross_encoder(tmp_path):
    """A dropout-free 2-layer cross-encoder directory initialised wide (std 0.5), so that its logits spread
    well apart (BERT's usual 0.02 scores every pair alike: any loss would then be log(1 + N))."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from dpr.models.hub import default_model_path
    from dpr.rerank.model import ST_ACTIVATION, save_cross_encoder

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(default_model_path())
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=256, num_labels=1, initializer_range=0.5,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(cfg)
    model.config.sentence_transformers = {"activation_fn": ST_ACTIVATION}
    return save_cross_encoder(model, tok, tmp_path / "ce", {"max_length": 64, "title": True})


def _results_file(tiny_data_dir, path):
    from tests.conftest import TINY_PASSAGES, TINY_QA
    from dpr.data.results import write_results

    ctxs = [{"id": pid, "title": title, "text": text, "score": float(-i)}
            for i, (pid, text, title) in enumerate(TINY_PASSAGES)]
    write_results(path, [{"question": q, "answers": a, "ctxs": ctxs} for q, a, _ in TINY_QA[:3]])
    return path


def test_bench_rerank_json_scores_and_losses_match_the_peer(tiny_cross_encoder, tiny_data_dir, tmp_path, monkeypatch,
                                                           one_thread):
    monkeypatch.setenv("DPR_NO_BF16", "1")
    out = tmp_path / "rerank.json"
    results = _results_file(tiny_data_dir, tmp_path / "results.json")
    script("bench_rerank").main([
        "--model", str(tiny_cross_encoder), "--results", str(results), "--k", "5", "--pairs", "10",
        "--data-dir", str(tiny_data_dir), "--data", "tiny", "--batch-size", "4", "--repeats", "2", "--warmup", "0",
        "--precision", "both", "--threads", "1", "--steps", "3", "--train-batch-size", "4",
        "--negatives", str(NEGATIVES), "--lr", "1e-2", "--peak-n", "64",
        "--json", str(out)])  # 4 x (1 + N) = 12 pairs a step: ours (buckets of 8) forwards them as 8 + 4
    rep = json.loads(out.read_text())
    assert rep["precisions"] == ["fp32"] and "bf16" in rep["skipped"]  # both = fp32 only without native bf16
    assert rep["threads"] == 1 and isinstance(rep["cpu_flags"], list)
    for part in ("score", "train"):
        sub = rep[part]
        assert set(sub) >= KEYS and set(sub["ratio"]) == {"fp32", "bf16", "best"} and sub["unit"] == "pairs/s"
        lever = {("ours-one-forward", "fp32")} if part == "train" else set()  # the default length_bucket_size is 8
        assert {(r["system"], r["precision"]) for r in sub["rows"]} == {("ours", "fp32"), ("sentence-transformers", "fp32")} | lever
        for r in sub["rows"]:
            assert r["per_s"] > 0 and (r["mfu"] is not None) == r["system"].startswith("ours")
        assert sub["ratio"]["fp32"] > 0 and sub["ratio"]["best"] == sub["ratio"]["fp32"]

    score = rep["score"]
    assert score["pairs"] == 10 and score["questions"] == 2 and str(results) in score["source"]  # 5 + 5 of the top 5
    peer = {r["system"]: r for r in score["rows"]}["sentence-transformers"]
    assert len(peer["times_s"]) == 2 and 0 <= peer["max_abs_diff_vs_ours_fp32"] <= 1e-4

    train = rep["train"]
    assert train["source"].endswith("train.json") and train["pairs_per_step"] == 4 * (1 + NEGATIVES)
    rows = {r["system"]: r for r in train["rows"]}
    ours, theirs = rows["ours"], rows["sentence-transformers"]
    assert len(ours["times_s"]) == len(theirs["times_s"]) == 3
    # a loss that moved away from the uniform one, and from step to step: the equality below is not trivial
    assert abs(ours["first_loss"] - math.log(1 + NEGATIVES)) > 0.05 and ours["last_loss"] != ours["first_loss"]
    assert theirs["first_loss"] == pytest.approx(ours["first_loss"], abs=1e-4)
    assert theirs["max_abs_loss_diff_vs_ours"] <= 1e-4  # every step: same batches, same gradients, same AdamW
    # one forward gives the same step as ours' length buckets: its own copy's losses follow ours step for step
    assert rows["ours-one-forward"]["max_abs_loss_diff_vs_ours"] <= 1e-4
    assert ours["levers"] == ["rerank.train.precision=fp32", "rerank.train.length_bucket_size=8"]
    assert rows["ours-one-forward"]["levers"][-1] == "rerank.train.length_bucket_size=0"
    assert "one-forward" in train["ratio_levers"]


def test_synthetic_fallback_gives_the_peer_expressible_groups(tmp_path):
    from argparse import Namespace

    bench = script("bench_rerank")
    args = Namespace(data_dir=tmp_path / "none", data="x", train_batch_size=3, negatives=NEGATIVES, seed=1,
                     results=None, pairs=7, k=5)
    groups, source, skipped = bench.load_groups(args, 5)
    assert len(groups) == 5 and source.startswith("synthetic") and skipped == 0
    assert all(g.positive == [True] + [False] * NEGATIVES and not any(g.ignore) for g in groups)
    questions, docs, source = bench.load_pairs(args, lambda title, text: f"{title} | {text}")
    assert len(questions) == len(docs) == 7 and source.startswith("synthetic") and " | " in docs[0]
    assert bench.synthetic_examples(3, 2, 1) == bench.synthetic_examples(3, 2, 1)  # seeded


@pytest.mark.parametrize("argv, said", [(["--steps", "0"], "--steps: expected a whole number >= 2"),
                                        (["--steps", "1"], "--steps: expected a whole number >= 2"),
                                        (["--negatives", "0"], "--negatives: expected a whole number >= 1"),
                                        (["--length-bucket-lever", "-1"], "--length-bucket-lever: expected a whole number >= 0")])
def test_bad_arguments_are_one_line_before_any_work(argv, said, capsys):
    with pytest.raises(SystemExit) as info:
        script("bench_rerank").main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and said in err, err
