"""The reader: char↔token answer mapping over windows, choosing across passages, and a tiny random
reader trained and evaluated end to end through the console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpr.reader.infer import AnswerRule, Reading, choose
from dpr.reader.open_domain import answer_at_k
from dpr.reader.windows import char_to_token_span, find_answer_spans, make_windows
from tests.run_command import run_command

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from dpr.models.hub import default_model_path

    return AutoTokenizer.from_pretrained(default_model_path())


PASSAGE = ("Le Théâtre de l'Odéon, à Paris, fut inauguré en 1782 (sous Louis XVI). "
           "Its façade — designed by Marie-Joseph Peyre & Charles De Wailly — faces the Café Procope's street; "
           "the 1,000-seat hall was rebuilt after fires in 1799 and 1818. Naïve critics said: «trop grand!» "
           "Today it hosts the Théâtre de l'Europe, renamed in 1990.")
ANSWERS = ["Théâtre de l'Odéon", "1782", "Marie-Joseph Peyre", "Café Procope's", "1,000-seat", "1818",
           "«trop grand!»", "Théâtre de l'Europe", "1990"]


def test_answers_round_trip_through_tokens_in_every_window(tokenizer):
    spans = find_answer_spans(PASSAGE, ANSWERS)
    assert len(spans) == len(ANSWERS)  # each answer found once, at a whole-word boundary
    windows = make_windows(tokenizer, "where is it?", "Odéon", PASSAGE, spans, max_length=48, stride=16)
    assert len(windows) > 3  # the passage really is cut
    covered = set()
    for w in windows:
        assert w.first <= w.last and all(w.offsets[t] is not None for t in range(w.first, w.last + 1))
        for a, b in spans:
            tok = char_to_token_span(w, a, b)
            if tok is None:
                continue  # this window does not hold the whole answer
            assert tok in w.answer_spans
            s, e = w.char_span(*tok)
            assert PASSAGE[s:e] == PASSAGE[a:b]  # characters → tokens → the same characters
            covered.add((a, b))
    # with a stride, every answer short enough lies whole inside some window
    assert covered == set(spans)
    # windows overlap and together cover the passage
    assert windows[0].offsets[windows[0].first][0] == 0
    assert windows[-1].offsets[windows[-1].last][1] == len(PASSAGE.rstrip())


def test_answer_outside_every_window_is_reported(tokenizer):
    text = "word " * 200 + "Honolulu"
    spans = find_answer_spans(text, ["Honolulu"])
    windows = make_windows(tokenizer, "q", "", text, spans, max_length=64, stride=0)
    last = windows[-1]
    assert last.answer_spans  # the last window holds it
    # without overflow windows (one window only), no window holds it: the caller counts it
    from dpr.reader.data import prepare_items

    rec = {"question": "q", "answers": ["Honolulu"], "positive_ctxs": [{"title": "", "text": text}],
           "hard_negative_ctxs": [], "negative_ctxs": []}
    settings = {"max_length": 64, "stride": 0, "max_question_length": 16, "title": False}
    items, counts = prepare_items([rec], tokenizer, settings)
    assert len(items) == 1 and counts.used == 1
    rec2 = {**rec, "answers": ["word word word word word word word word word word word word word word word "
                               "word word word word word word word word word word word word word word word "
                               "word word word word word word word word word word word word word word word "
                               "word word word word word word word word word word word word word word word word"]}
    items, counts = prepare_items([rec2, {**rec, "answers": ["Paris"]}, {**rec, "positive_ctxs": []}],
                                  tokenizer, settings)
    assert items == []
    assert (counts.answer_outside_windows, counts.answer_not_in_passage, counts.no_positive) == (1, 1, 1)


def test_whole_word_matching():
    assert find_answer_spans("a plant and an ant", ["an"]) == [(12, 14)]
    assert find_answer_spans("Paris, PARIS", ["paris"]) == [(0, 5), (7, 12)]  # any case when no exact case


def test_open_domain_picks_the_highest_scoring_span_across_passages():
    logit = AnswerRule("logit", 1.0)
    readings = [[[Reading("Paris", 3.0, 0.5)], [Reading("Lyon", 5.0, 1.0)], [Reading("Nice", 9.0, -4.0)]]]
    assert answer_at_k(readings, 1, logit) == ["Paris"]
    assert answer_at_k(readings, 2, logit) == ["Lyon"]   # 6.0 > 3.5
    assert answer_at_k(readings, 3, logit) == ["Lyon"]   # Nice: 9 - 4 = 5 < 6
    assert answer_at_k(readings, 3, AnswerRule("logit", 0.0)) == ["Nice"]  # span score alone
    tie = [[Reading("x", 1.0, 0.0)], [Reading("y", 1.0, 0.0)]]
    assert choose(tie, logit).answer == "x"  # ties: the higher-ranked passage
    assert answer_at_k([[]], 5, logit) == [""] and answer_at_k([[[]]], 5, logit) == [""]


def test_log_prob_rule_compares_spans_of_passages_with_different_logit_scales():
    # Nice's window has large logits everywhere (log-normaliser 12): its span is unlikely *in its window*
    # (log P = 9 - 12 = -3) although its raw logits beat Lyon's (log P = 5 - 5.5 = -0.5)
    readings = [[[Reading("Nice", 9.0, 0.0, log_norm=12.0)], [Reading("Lyon", 5.0, 0.0, log_norm=5.5)]]]
    assert answer_at_k(readings, 2, AnswerRule("logit", 1.0)) == ["Nice"]
    assert answer_at_k(readings, 2, AnswerRule("log_prob", 1.0)) == ["Lyon"]
    assert readings[0][1][0].log_prob == -0.5
    # the relevance still counts, with its weight: a much more relevant passage wins
    readings[0][0][0].relevance = 3.0
    assert answer_at_k(readings, 2, AnswerRule("log_prob", 1.0)) == ["Nice"]   # -3 + 3 > -0.5
    assert answer_at_k(readings, 2, AnswerRule("log_prob", 0.5)) == ["Lyon"]   # -3 + 1.5 < -0.5
    with pytest.raises(ValueError):
        AnswerRule("softmax", 1.0)


def test_a_window_span_is_scored_with_its_own_window_relevance():
    # passage 1 has two windows: the best span in one, the best relevance in the other; mixing them
    # (span 10 + relevance 5) would wrongly beat passage 2's single window (8 + 0)
    readings = [[[Reading("a", 10.0, -5.0), Reading("b", 1.0, 5.0)], [Reading("c", 8.0, 0.0)]]]
    assert answer_at_k(readings, 2, AnswerRule("logit", 1.0)) == ["c"]
    assert answer_at_k(readings, 1, AnswerRule("logit", 1.0)) == ["b"]   # 1 + 5 > 10 - 5


def test_rank_prior_prefers_the_retrievers_order_by_log_of_rank():
    # "far" (rank 2) has the higher span score, 7 > 5; with rank_weight 2 it pays 2*log(3) = 2.2 and loses
    readings = [[[Reading("near", 5.0, 0.0)], [Reading("mid", 1.0, 0.0)], [Reading("far", 7.0, 0.0)]]]
    assert answer_at_k(readings, 3, AnswerRule("logit", 1.0, 0.0)) == ["far"]
    assert answer_at_k(readings, 3, AnswerRule("logit", 1.0, 2.0)) == ["near"]   # 5 > 7 - 2.197
    assert answer_at_k(readings, 3, AnswerRule("logit", 1.0, 1.0)) == ["far"]    # 5 < 7 - 1.099
    assert AnswerRule("logit", 1.0, 2.0).score(Reading("x", 1.0, 0.5), rank=0) == 1.5  # rank 0: no penalty
    with pytest.raises(ValueError):
        AnswerRule("logit", 1.0, -1.0)


def test_gold_passages_are_read_without_the_rank_prior():
    from dpr.reader.evaluate import answer_rule

    ecfg = {"span_score": "logit", "passage_weight": 1.0, "rank_weight": 2.0}
    assert answer_rule(ecfg).rank_weight == 2.0 and answer_rule(ecfg, retrieved=False).rank_weight == 0.0


def _reader(*args: str) -> subprocess.CompletedProcess:
    return run_command(["dpr-reader", *args])  # the console script's main, in-process


def test_tiny_reader_trains_resumes_and_evaluates_end_to_end(tiny_data_dir, tiny_model_dir, tmp_path):
    data = json.loads((tiny_data_dir / "tiny" / "train.json").read_text())
    for i, ex in enumerate(data):  # another question's passage: a negative without this answer
        ex["hard_negative_ctxs"] = [data[(i + 1) % len(data)]["positive_ctxs"][0]]
    (tiny_data_dir / "tiny" / "train.json").write_text(json.dumps(data))
    out = tmp_path / "reader"
    common = ["data.name=tiny", f"data_dir={tiny_data_dir}", f"output_dir={out}", f"model={tiny_model_dir}",
              "reader_cfg.max_length=64", "reader_cfg.train.batch_size=4", "reader_cfg.train.lr=1e-3",
              "reader_cfg.train.save_every=2", "reader_cfg.train.log_every=1"]
    proc = _reader("train", *common, "reader_cfg.train.max_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "checkpoints" / "step_2" / "state.json").is_file()
    proc = _reader("train", *common, "reader_cfg.train.max_steps=4")  # resumes at step 2
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["resumed_from_step"] == 2 and summary["steps"] == 4
    assert summary["data"]["used"] == 8
    assert (out / "reader" / "encoder" / "config.json").is_file()  # HF format
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4

    results = [{"question": q, "answers": a,
                "ctxs": [{"id": p["passage_id"], "title": p["title"], "text": p["text"], "score": 1.0}
                         for p in (ex["positive_ctxs"][0], ex["hard_negative_ctxs"][0])]}
               for ex in data for q, a in [(ex["question"], ex["answers"])]]
    res_file = tmp_path / "results.json"
    res_file.write_text(json.dumps(results))
    proc = _reader("eval", f"model={out}", f"results={res_file}", f"output={tmp_path / 'eval.json'}",
                   "data.name=tiny", f"data_dir={tiny_data_dir}", "gold_split=train", "reader_cfg.eval.ks=[1,2]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ev = json.loads((tmp_path / "eval.json").read_text())
    assert set(ev["figures"]["open_domain"]) == {"1", "2"}
    assert ev["top_k"]["2"] == 1.0  # the positive is among the two passages of every question
    for fig in [ev["figures"]["gold"], *ev["figures"]["open_domain"].values()]:
        assert set(fig) == {"em", "f1"} and 0.0 <= fig["em"] <= fig["f1"] <= 1.0
    assert len(ev["predictions"]["open_domain"]["2"]) == 8
    # every prediction is a span of one of the question's passages
    for rec, pred in zip(results, ev["predictions"]["open_domain"]["2"]):
        assert any(pred in c["text"] for c in rec["ctxs"])

    bad = _reader("eval", f"model={tmp_path}", f"results={res_file}", f"output={tmp_path / 'x.json'}")
    assert bad.returncode == 2 and "not a reader directory" in bad.stderr


def test_resumed_training_equals_a_straight_run(tiny_data_dir, tiny_model_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file

    from dpr.reader.train import train_reader

    data = json.loads((tiny_data_dir / "tiny" / "train.json").read_text())
    for i, ex in enumerate(data):
        ex["hard_negative_ctxs"] = [data[(i + 1) % len(data)]["positive_ctxs"][0], data[(i + 2) % len(data)]["positive_ctxs"][0]]
    train = tmp_path / "train.json"
    train.write_text(json.dumps(data))
    cfg = {"model": str(tiny_model_dir), "max_length": 64, "stride": 16, "max_question_length": 16, "title": True,
           "train": {"batch_size": 3, "negatives": 1, "epochs": 1, "max_steps": 5, "max_questions": 0, "lr": 1e-3,
                     "weight_decay": 0.01, "warmup_ratio": 0.2, "max_grad_norm": 1.0, "precision": "fp32",
                     "cpu_threads": 0, "seed": 3, "log_every": 1, "save_every": 2, "keep_checkpoints": 5,
                     "resume": "auto"}}
    train_reader(cfg, train, tmp_path / "straight")
    # a run killed after step 4's checkpoint: later checkpoints and the final model never written
    train_reader(cfg, train, tmp_path / "killed")
    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "step_5")
    shutil.rmtree(tmp_path / "killed" / "reader")
    summary = train_reader(cfg, train, tmp_path / "killed")
    assert summary["resumed_from_step"] == 4
    a = load_file(str(tmp_path / "straight" / "reader" / "reader_head.safetensors"))
    b = load_file(str(tmp_path / "killed" / "reader" / "reader_head.safetensors"))
    assert a.keys() == b.keys() and all(torch_equal(a[k], b[k]) for k in a)
    # different settings into the finished run: refused (nothing touched) unless overwrite, then trained afresh
    cfg["train"]["lr"] = 5e-4
    before = (tmp_path / "killed" / "train_summary.json").read_bytes()
    with pytest.raises(ValueError, match=r"finished run trained with other settings.*train.lr.*overwrite=true"):
        train_reader(cfg, train, tmp_path / "killed")
    assert (tmp_path / "killed" / "train_summary.json").read_bytes() == before
    assert train_reader(cfg, train, tmp_path / "killed", overwrite=True)["resumed_from_step"] == 0
    # a killed run of other settings (no summary) is not this run's past: its checkpoints are ignored
    cfg["train"]["lr"] = 3e-4
    shutil.rmtree(tmp_path / "killed" / "reader")
    (tmp_path / "killed" / "train_summary.json").unlink()
    assert train_reader(cfg, train, tmp_path / "killed")["resumed_from_step"] == 0


def torch_equal(x, y) -> bool:
    import torch

    return bool(torch.equal(x, y))


def test_read_pairs_returns_a_span_of_each_passage_and_skips_empty_ones(tiny_model_dir):
    import torch

    from dpr.reader.infer import read_pairs
    from dpr.reader.model import build_reader

    torch.manual_seed(0)
    model, tok = build_reader(str(tiny_model_dir))
    settings = {"max_length": 48, "stride": 8, "max_question_length": 16, "title": True}
    long_text = " ".join(f"word{i}" for i in range(120))  # several windows
    pairs = [("q one", "T", "Paris is the capital of France."), ("q two", "", "   "), ("q three", "L", long_text)]
    readings = read_pairs(model.eval(), tok, settings, pairs, max_answer_length=4, batch_size=2, precision="fp32")
    assert len(readings) == 3
    assert len(readings[0]) == 1 and readings[0][0].answer and readings[0][0].answer in pairs[0][2]
    assert readings[1] == []  # nothing to read: no window, never chosen
    assert len(readings[2]) > 1  # one reading per window
    for r in readings[2]:
        assert r.answer in long_text and len(tok(r.answer, add_special_tokens=False)["input_ids"]) <= 4
    for r in (*readings[0], *readings[2]):
        assert r.log_prob <= 1e-9  # a log-probability of a (start, end) pair
    assert choose(readings, AnswerRule("log_prob", 1.0)) is not None


def test_log_norm_is_the_log_softmax_normaliser_over_passage_tokens():
    import numpy as np
    import torch

    from dpr.reader.infer import _log_norm

    rng = np.random.default_rng(0)
    start, end = rng.normal(size=20) * 5, rng.normal(size=20) * 5
    want = torch.logsumexp(torch.tensor(start[3:15]), 0) + torch.logsumexp(torch.tensor(end[3:15]), 0)
    assert abs(_log_norm(start, end, 3, 14) - float(want)) < 1e-9
