"""The cross-encoder reranker: losses against hand computations, the input layout, training groups
(filters, seeding), scoring and reranking order, config range checks, and the sentence-transformers export."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpr.rerank.config import RerankConfig
from dpr.rerank.losses import bce_loss, group_accuracy, listwise_loss
from tests.run_command import run_as_subprocess

REPO = Path(__file__).resolve().parents[2]


# --- losses ------------------------------------------------------------------------------------------

def test_listwise_loss_is_softmax_cross_entropy_over_the_kept_candidates():
    scores = torch.tensor([[2.0, 1.0, 0.5, 3.0], [0.2, 0.1, -1.0, 0.4]])
    positive = torch.tensor([[True, False, False, False], [True, False, True, False]])
    ignore = torch.tensor([[False, False, False, True], [False, False, False, False]])
    # row 0: candidate 3 ignored (an answer-bearing passage): -log(e^2 / (e^2 + e^1 + e^0.5))
    row0 = -math.log(math.exp(2.0) / (math.exp(2.0) + math.exp(1.0) + math.exp(0.5)))
    # row 1: two positives: -log((e^0.2 + e^-1) / sum of all four)
    row1 = -math.log((math.exp(0.2) + math.exp(-1.0)) / sum(math.exp(v) for v in (0.2, 0.1, -1.0, 0.4)))
    assert listwise_loss(scores, positive, ignore).item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    # the ignored candidate's score does not matter
    moved = scores.clone()
    moved[0, 3] = 50.0
    assert listwise_loss(moved, positive, ignore).item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    assert group_accuracy(scores, positive, ignore) == 0.5  # row 0: best kept is the positive; row 1: 0.4 is not
    with pytest.raises(ValueError, match="positive"):
        listwise_loss(scores, positive, positive)


def test_bce_loss_is_the_mean_binary_cross_entropy_of_the_kept_pairs():
    scores = torch.tensor([[1.5, -0.5, 2.0]])
    positive = torch.tensor([[True, False, False]])
    ignore = torch.tensor([[False, False, True]])

    def sig(x: float) -> float:
        return 1.0 / (1.0 + math.exp(-x))

    expected = (-math.log(sig(1.5)) - math.log(1.0 - sig(-0.5))) / 2
    assert bce_loss(scores, positive, ignore).item() == pytest.approx(expected, rel=1e-6)


# --- model input layout ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_ce(tiny_model_dir):
    from dpr.rerank.model import build_cross_encoder

    torch.manual_seed(0)
    model, tok = build_cross_encoder(str(tiny_model_dir))
    return model.eval(), tok


def test_pair_reads_cls_question_sep_title_sep_passage_sep(tiny_ce):
    from dpr.rerank.model import document_text, tokenize_pairs

    _, tok = tiny_ce
    enc = tokenize_pairs(tok, ["who wrote hamlet"], [document_text("Hamlet", "a tragedy", tok)], 64)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"][0])
    assert tokens == ["[CLS]", "who", "wrote", "hamlet", "[SEP]", "hamlet", "[SEP]", "a", "tragedy", "[SEP]"]
    assert enc["token_type_ids"][0].tolist() == [0] * 5 + [1] * 5
    assert document_text("", "text only", tok) == "text only"
    assert document_text("T", "x", tok, use_title=False) == "x"


# --- training groups ---------------------------------------------------------------------------------

def _ctx(pid: str, text: str, title: str = "") -> dict:
    return {"passage_id": pid, "title": title, "text": text}


def _examples() -> list[dict]:
    return [
        {"question": "capital of hawaii", "answers": ["Honolulu"],
         "positive_ctxs": [_ctx("p1", "Honolulu is the capital of Hawaii.")], "negative_ctxs": [],
         "hard_negative_ctxs": [_ctx("a1", "The city of Honolulu lies on Oahu."),   # answer-bearing: never a negative
                                _ctx("n1", "Paris is in France."), _ctx("n2", "Berlin is in Germany."),
                                _ctx("n3", "Water boils at 100 degrees."), _ctx("n4", "Everest is high.")]},
        {"question": "what is nfcorpus", "answers": [], "qrels": {"q1": 2, "j1": 1},
         "positive_ctxs": [_ctx("q1", "a judged passage")], "negative_ctxs": [],
         "hard_negative_ctxs": [_ctx("j1", "judged but past the positives cap"),   # judged: never a negative
                                _ctx("m1", "mined one"), _ctx("m2", "mined two"), _ctx("m3", "mined three")]},
        {"question": "no positive", "answers": ["x"], "positive_ctxs": [], "negative_ctxs": [],
         "hard_negative_ctxs": [_ctx("z", "zzz")]},
    ]


def test_groups_never_use_answer_bearing_or_judged_passages_as_negatives(tmp_path):
    from dpr.rerank.data import GroupBatches, read_groups_source

    path = tmp_path / "train.json"
    path.write_text(json.dumps(_examples()))
    examples, kind = read_groups_source(path)
    assert kind == "qrels" and len(examples) == 2  # the example without a positive is skipped
    batches = GroupBatches(examples, batch_size=2, negatives=3, seed=5, multi_positive=True)
    seen = set()
    for step in range(40):  # many epochs: every draw of negatives
        _, groups = batches.groups(step)
        for g in groups:
            assert len(g.passages) == 4 and g.positive[0] and not g.ignore[0]
            ids = [c["passage_id"] for c in g.passages[1:]]
            seen.update(ids)
            assert "a1" not in ids and "j1" not in ids
            # a drawn top-up that is another question's answer-bearing passage or judged doc is masked
            for c, pos, ign in zip(g.passages[1:], g.positive[1:], g.ignore[1:]):
                if g.question.startswith("capital") and "Honolulu" in c["text"]:
                    assert ign
                assert not pos or c["passage_id"] in ("q1", "j1")
    assert {"n1", "n2", "n3", "n4", "m1", "m2", "m3"} <= seen


def test_groups_are_a_function_of_seed_and_step():
    from dpr.rerank.data import GroupBatches, without_false_negatives

    examples = [e for e in _examples() if e["positive_ctxs"]] * 3
    a = GroupBatches(examples, 2, 2, seed=1, multi_positive=False)
    b = GroupBatches(examples, 2, 2, seed=1, multi_positive=False)
    other = GroupBatches(examples, 2, 2, seed=2, multi_positive=False)
    steps = [7, 0, 3, 7, 1]  # out of order, as a resumed run asks for them
    assert [b.groups(s) for s in steps] == [a.groups(s) for s in steps]
    assert [other.groups(s) for s in range(6)] != [a.groups(s) for s in range(6)]
    assert [c["passage_id"] for c in without_false_negatives(_examples()[0])["hard_negative_ctxs"]] == ["n1", "n2", "n3", "n4"]


# --- scoring and reranking ---------------------------------------------------------------------------

def test_scores_do_not_depend_on_batching_and_come_back_in_input_order(tiny_ce):
    from dpr.rerank.score import score_pairs

    model, tok = tiny_ce
    qs = ["q one", "a much longer second question about things", "three"] * 3
    ps = [f"passage {'word ' * (i * 5)} {i}" for i in range(9)]
    one = score_pairs(model, tok, qs, ps, batch_size=1, autocast="fp32", max_length=64)
    many = score_pairs(model, tok, qs, ps, batch_size=4, autocast="fp32", max_length=64)
    direct = torch.stack([model(**tok(q, p, return_tensors="pt")).logits[0, 0] for q, p in zip(qs, ps)]).detach()
    assert torch.allclose(one, direct, atol=1e-5) and torch.allclose(many, direct, atol=1e-5)


def test_rerank_order_is_the_sort_by_cross_encoder_scores(tiny_ce):
    from dpr.rerank.model import document_text
    from dpr.rerank.score import rerank_results, score_pairs

    model, tok = tiny_ce
    results = [{"question": f"question {i}", "answers": ["x"],
                "ctxs": [{"id": f"d{i}-{j}", "title": f"T{j}", "text": f"text {j} " * (j + 1), "score": 10.0 - j}
                         for j in range(6)]} for i in range(3)]
    settings_ = {"max_length": 64, "title": True}
    out = rerank_results(model, tok, results, 4, settings_, batch_size=5, autocast="fp32")
    for rec, new in zip(results, out):
        top = rec["ctxs"][:4]
        scores = score_pairs(model, tok, [rec["question"]] * 4, [document_text(c["title"], c["text"], tok) for c in top],
                             autocast="fp32", max_length=64).tolist()
        expected = sorted(range(4), key=lambda j: (-scores[j], j))
        assert [c["id"] for c in new["ctxs"]] == [top[j]["id"] for j in expected]
        assert [c["first_stage_rank"] for c in new["ctxs"]] == expected
        assert [c["score"] for c in new["ctxs"]] == pytest.approx([scores[j] for j in expected], abs=1e-5)
        assert [c["first_stage_score"] for c in new["ctxs"]] == [top[j]["score"] for j in expected]


# --- config checks -----------------------------------------------------------------------------------

@pytest.mark.parametrize("override, key", [
    ({"train": {"lr": -1.0}}, "rerank.train.lr"), ({"train": {"lr": float("nan")}}, "rerank.train.lr"),
    ({"train": {"batch_size": 0}}, "rerank.train.batch_size"), ({"train": {"loss": "hinge"}}, "rerank.train.loss"),
    ({"train": {"warmup_ratio": 1.5}}, "rerank.train.warmup_ratio"), ({"max_length": 4}, "rerank.max_length"),
    ({"score": {"k": 0}}, "rerank.score.k"), ({"train": {"precision": "fp8"}}, "rerank.train.precision"),
    ({"train": {"negatives": 0}}, "rerank.train.negatives"), ({"train": {"lrate": 1.0}}, "lrate"),
])
def test_bad_values_name_the_key_in_one_line(override, key):
    with pytest.raises(ValueError) as err:
        RerankConfig.from_dict(override)
    assert key in str(err.value) and "\n" not in str(err.value)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(["lr", "weight_decay", "warmup_ratio", "max_grad_norm"]),
       value=st.floats(allow_nan=True, allow_infinity=True, width=32))
def test_float_keys_accept_exactly_their_finite_range(key, value):
    ranges = {"lr": (0.0, 1.0, True), "weight_decay": (0.0, 10.0, False), "warmup_ratio": (0.0, 1.0, False),
              "max_grad_norm": (-math.inf, math.inf, False)}
    low, high, open_low = ranges[key]
    ok = math.isfinite(value) and (value > low if open_low else value >= low) and value <= high
    if ok:
        assert getattr(RerankConfig.from_dict({"train": {key: value}}).train, key) == value
    else:
        with pytest.raises(ValueError, match=f"rerank.train.{key} must be"):
            RerankConfig.from_dict({"train": {key: value}})


def test_cli_bad_values_are_one_line(tmp_path):
    for arg, key in (("rerank.train.lr=0", "rerank.train.lr"), ("rerank.train.lr=abc", "rerank.train.lr"),
                     ("rerank.train.batchsize=3", "batchsize"), ("rerank.score.k=-2", "rerank.score.k")):
        proc = run_as_subprocess([sys.executable, "-m", "dpr.cli.rerank", "train", "data.name=tiny", arg,
                                  f"output_dir={tmp_path / 'o'}"], cwd=tmp_path, capture_output=True, text=True,
                                 env={**__import__("os").environ, "PYTHONPATH": str(REPO)}, timeout=300)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and key in lines[0], proc.stderr


# --- sentence-transformers export --------------------------------------------------------------------

def test_export_loads_in_sentence_transformers_with_the_same_scores(tiny_ce, tmp_path):
    from sentence_transformers import CrossEncoder

    from dpr.cli.export import CHECK_PASSAGES, CHECK_QUESTIONS
    from dpr.export.cross_encoder import compare_cross_encoder_export
    from dpr.rerank.model import document_text, save_cross_encoder
    from dpr.rerank.score import score_pairs

    model, tok = tiny_ce
    ce = save_cross_encoder(model, tok, tmp_path / "ce", {"max_length": 48, "title": True})
    out = tmp_path / "export"
    proc = run_as_subprocess([sys.executable, "-m", "dpr.cli.export", f"model={ce}", f"output={out}", "check=true"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300,
                             env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "README.md").read_text().startswith("---\n") and "CrossEncoder" in (out / "README.md").read_text()
    figures = compare_cross_encoder_export(ce, out, CHECK_QUESTIONS, CHECK_PASSAGES)
    assert figures["max_abs_diff"] <= 1e-4 and figures["same_order"] == len(CHECK_QUESTIONS)
    # and directly: predict() returns our logits (not their sigmoid), truncated at the trained length
    long_text = "word " * 200
    pairs = [("who wrote hamlet", document_text("Hamlet", "Hamlet is a tragedy.", tok)),
             ("what is long", document_text("Long", long_text, tok))]
    st_scores = CrossEncoder(str(out), device="cpu", local_files_only=True).predict(pairs, show_progress_bar=False)
    ours = score_pairs(model, tok, [q for q, _ in pairs], [d for _, d in pairs], autocast="fp32", max_length=48)
    assert torch.allclose(torch.tensor(st_scores, dtype=torch.float32), ours, atol=1e-4)
    # the saved encoder/ directory itself is already a CrossEncoder (the export only adds its config and card)
    raw = CrossEncoder(str(ce / "encoder"), device="cpu", local_files_only=True).predict(pairs, show_progress_bar=False)
    assert torch.allclose(torch.tensor(raw, dtype=torch.float32), ours, atol=1e-4)


def test_a_system_reranked_with_another_systems_logits_is_the_same_list_scoring_only_new_pairs(tiny_ce):
    """The pipeline's rerank stages reuse the logits the systems reranked before hold (first stages
    share most of their top passages): the lists come out as if scored from scratch, fewer pairs scored."""
    from dpr.rerank.runs import known_pairs, timed_rerank

    model, tok = tiny_ce
    settings = {"max_length": 64, "title": True}
    texts = ["red apple pie", "blue sky", "green grass field", "the sea", "apple orchard", "old town"]

    def records(order):
        return [{"question": q, "answers": [], "ctxs": [{"id": f"p{j}", "title": "t", "text": texts[j],
                                                           "score": float(-r)} for r, j in enumerate(order)]}
                for q in ("apple pie", "grass")]

    first, second = records([0, 1, 2, 3, 4, 5]), records([2, 4, 0, 5, 1, 3])
    done, s1 = timed_rerank(model, tok, settings, first, 3, precision="fp32")
    assert (s1["pairs"], s1["scored"], s1["reused"]) == (6, 6, 0) and s1["seconds_per_question"] > 0
    known = known_pairs(done, 3)
    assert len(known) == 6
    fresh, _ = timed_rerank(model, tok, settings, second, 3, precision="fp32")
    again, s2 = timed_rerank(model, tok, settings, second, 3, precision="fp32", known=known)
    # top 3 of `second` are p2, p4, p0: p0 and p2 were in `first`'s top 3, p4 was not
    assert (s2["pairs"], s2["reused"], s2["scored"]) == (6, 4, 2)
    assert [[c["id"] for c in r["ctxs"]] for r in again] == [[c["id"] for c in r["ctxs"]] for r in fresh]
    assert [c["score"] for r in again for c in r["ctxs"][:3]] == pytest.approx(
        [c["score"] for r in fresh for c in r["ctxs"][:3]], abs=1e-5)


def _many_topic_examples(n: int = 12) -> list[dict]:
    """Questions with 4 mined negatives each, every passage its own; the pool holds all of them."""
    return [{"question": f"q{i}", "answers": [], "negative_ctxs": [],
             "positive_ctxs": [_ctx(f"p{i}", f"positive {i}")],
             "hard_negative_ctxs": [_ctx(f"h{i}_{j}", f"mined {i} {j}") for j in range(4)]} for i in range(n)]


@pytest.mark.parametrize("source,mined", [("mined", 3), ("mixed", 2), ("random", None)])
def test_negatives_from_sets_how_many_negatives_are_mined(source, mined):
    from dpr.rerank.data import GroupBatches

    examples = _many_topic_examples()
    batches = GroupBatches(examples, 4, 3, seed=3, multi_positive=False, negatives_from=source)
    again = GroupBatches(examples, 4, 3, seed=3, multi_positive=False, negatives_from=source)
    counts = []
    for step in range(30):
        _, groups = batches.groups(step)
        assert groups == again.groups(step)[1]  # seeded: a function of (seed, step)
        for g in groups:
            i = g.question[1:]
            ids = [c["passage_id"] for c in g.passages]
            assert ids[0] == f"p{i}" and len(set(ids)) == 4
            counts.append(sum(pid.startswith(f"h{i}_") for pid in ids[1:]))
    # the rest are drawn from the 60 training passages, which hold the question's other mined ones by chance
    assert min(counts) == (mined or 0) and sum(counts) / len(counts) < (mined or 0) + 0.6
    if source == "mined":
        assert set(counts) == {3}


def test_negatives_from_is_checked_and_left_out_of_old_fingerprints():
    with pytest.raises(ValueError, match="rerank.train.negatives_from='top'"):
        RerankConfig.from_dict({"train": {"negatives_from": "top"}})
    assert "negatives_from" not in RerankConfig().as_dict()["train"]  # mined: the recorded runs' behaviour
    assert RerankConfig.from_dict({"train": {"negatives_from": "mixed"}}).as_dict()["train"]["negatives_from"] == "mixed"


def test_an_unmined_training_file_is_said_once_not_trained_on_in_silence(caplog):
    from dpr.rerank.data import GroupBatches
    from dpr.training.batching import warn_topped_up

    mined = _many_topic_examples()  # 4 mined negatives each
    unmined = [{**ex, "hard_negative_ctxs": []} for ex in mined]
    with caplog.at_level("WARNING", logger="dpr.training.batching"):
        assert warn_topped_up(mined, 4) == 0 and warn_topped_up(mined, 0) == 0
        assert not caplog.records
        assert warn_topped_up(mined, 5) == 12
        assert "12 of 12 training questions have fewer than 5 mined negatives (0 have none)" in caplog.text
        assert "dpr-bm25 mine=true" not in caplog.text
        caplog.clear()
        GroupBatches(unmined, 4, 3, seed=0, multi_positive=False)
        assert len(caplog.records) == 1 and "(12 have none)" in caplog.text and "dpr-bm25 mine=true" in caplog.text
        caplog.clear()
        GroupBatches(unmined, 4, 3, seed=0, multi_positive=False, negatives_from="random")  # asked for: no warning
        assert not caplog.records
