"""Top-k accuracy, bootstrap statistics, the side-by-side report, and refusal of bad results files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpr.errors import DataError
from dpr.eval import stats
from dpr.eval.report import evaluate_qa, system_names
from dpr.eval.topk import NO_HIT, first_hit_ranks, top_k_accuracy
from tests.run_command import run_as_subprocess

BIN = Path(sys.executable).parent


def ctx(pid: str, text: str, score: float, has_answer: bool = False) -> dict:
    return {"id": pid, "title": "", "text": text, "score": score, "has_answer": has_answer}


def filler(n: int, start: int = 0) -> list[dict]:
    return [ctx(f"f{start + i}", f"nothing relevant here {i}", 10.0 - i) for i in range(n)]


def system_a() -> list[dict]:
    """4 questions; first answer-bearing passage at rank 1, rank 3, never, rank 7 (1-based)."""
    return [
        {"question": "q1", "answers": ["Honolulu"], "ctxs": [ctx("a", "born in Honolulu", 9)] + filler(9)},
        # the stored has_answer flags lie (rank 1 says True but has no answer): they must be ignored
        {"question": "q2", "answers": ["Paris"],
         "ctxs": [ctx("x", "London calling", 9, True)] + filler(1) + [ctx("b", "Paris, France", 7)] + filler(7)},
        {"question": "q3", "answers": ["Everest"], "ctxs": filler(10)},
        {"question": "q4", "answers": ["ATP", "adenosine"],
         "ctxs": filler(6) + [ctx("c", "it makes atp", 3)] + filler(3, 6)},
    ]


def system_b() -> list[dict]:
    """Same questions; first hits at rank 2, rank 1, rank 4, never."""
    return [
        {"question": "q1", "answers": ["Honolulu"], "ctxs": filler(1) + [ctx("a", "Honolulu!", 8)] + filler(8)},
        {"question": "q2", "answers": ["Paris"], "ctxs": [ctx("b", "PARIS", 9)] + filler(9)},
        {"question": "q3", "answers": ["Everest"], "ctxs": filler(3) + [ctx("e", "Mount Everest", 5)] + filler(6)},
        {"question": "q4", "answers": ["ATP", "adenosine"], "ctxs": filler(10)},
    ]


def write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def test_first_hit_ranks_recompute_has_answer():
    ranks = first_hit_ranks(system_a())
    assert ranks.tolist() == [0, 2, NO_HIT, 6]


def test_top_k_arithmetic_by_hand():
    ranks = first_hit_ranks(system_a())
    acc = top_k_accuracy(ranks, ks=[1, 2, 3, 5, 7, 10])
    # hits within k: k=1 {q1}; k=2 {q1}; k=3 {q1,q2}; k=5 {q1,q2}; k=7 {q1,q2,q4}; k=10 same
    assert acc == {1: 0.25, 2: 0.25, 3: 0.5, 5: 0.5, 7: 0.75, 10: 0.75}


def test_bootstrap_ci_is_seeded_and_brackets_the_mean():
    rng = np.random.default_rng(1)
    values = (rng.random((500, 2)) < [0.3, 0.7]).astype(float)
    s1 = stats.bootstrap_means(values, num_resamples=400, seed=3)
    s2 = stats.bootstrap_means(values, num_resamples=400, seed=3)
    assert np.array_equal(s1, s2)
    lo, hi = stats.confidence_interval(s1)
    means = values.mean(axis=0)
    assert np.all(lo < means) and np.all(means < hi)
    # binomial standard error ~ sqrt(p(1-p)/n): the 95% interval is about +-1.96 of it
    se = np.sqrt(means * (1 - means) / len(values))
    assert np.allclose(hi - lo, 2 * 1.96 * se, rtol=0.25)


def test_sign_test_exact_values():
    # 5 discordant pairs all one way: p = 2 * (1/2)^5
    assert stats.sign_test_pvalue([1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]) == pytest.approx(0.0625)
    # 1 vs 9: p = 2 * (C(10,0) + C(10,1)) / 2^10
    a = [1] + [0] * 9
    b = [0] + [1] * 9
    assert stats.sign_test_pvalue(a, b) == pytest.approx(2 * 11 / 1024)
    assert stats.sign_test_pvalue([1, 0], [1, 0]) == 1.0


def test_paired_bootstrap_detects_a_real_difference():
    rng = np.random.default_rng(0)
    a = (rng.random(400) < 0.6).astype(float)
    b = a.copy()
    b[:40] = 0.0  # b misses 40 questions a gets (where a got them)
    samples = stats.bootstrap_means(np.stack([a, b], axis=1), num_resamples=1000, seed=0)
    delta = a.mean() - b.mean()
    assert delta > 0
    assert stats.paired_bootstrap_pvalue(samples[:, 0], samples[:, 1], delta) < 0.01
    assert stats.paired_bootstrap_pvalue(samples[:, 0], samples[:, 0], 0.0) == 1.0


def test_overlap_counts():
    assert stats.overlap([1, 1, 0, 0, 1], [1, 0, 1, 0, 1]) == {"both": 2, "only_a": 1, "only_b": 1, "neither": 1}


def test_evaluate_qa_report(tmp_path):
    fa, fb = write(tmp_path / "a.json", system_a()), write(tmp_path / "b.json", system_b())
    out = tmp_path / "report"
    report = evaluate_qa({"A": fa, "B": fb}, out, ks=[1, 5, 10, 20], notes={"hybrid": "w=0.3"},
                         num_resamples=200)
    saved = json.loads((out / "report.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["num_questions"] == 4
    assert saved["systems"]["A"]["top_k"] == {"1": 0.25, "5": 0.5, "10": 0.75, "20": 0.75}
    # B: ranks 2, 1, 4, never
    assert saved["systems"]["B"]["top_k"] == {"1": 0.25, "5": 0.75, "10": 0.75, "20": 0.75}
    for s in saved["systems"].values():
        for k, (lo, hi) in s["ci95"].items():
            assert 0.0 <= lo <= s["top_k"][k] <= hi <= 1.0
    (comp,) = saved["comparisons"]
    assert (comp["a"], comp["b"]) == ("A", "B")
    assert comp["top_k"]["5"]["delta"] == pytest.approx(-0.25)
    assert 0.0 <= comp["top_k"]["5"]["p_bootstrap"] <= 1.0
    assert comp["top_k"]["5"]["p_sign"] == pytest.approx(1.0)  # one discordant question
    # top-20 hits: A {q1,q2,q4}, B {q1,q2,q3}
    assert comp["overlap"] == {"k": 20, "both": 2, "only_a": 1, "only_b": 1, "neither": 0}
    assert saved["notes"] == {"hybrid": "w=0.3"}
    assert "bounds a reader's exact match" in saved["note"]
    md = (out / "report.md").read_text()
    assert "| A | 25.0 [" in md and "only A" in md and "w=0.3" in md
    assert (out / "topk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_question_order_does_not_matter(tmp_path):
    fa = write(tmp_path / "a.json", system_a())
    fb = write(tmp_path / "b.json", list(reversed(system_b())))
    report = evaluate_qa({"A": fa, "B": fb}, tmp_path / "r", ks=[1, 5], num_resamples=50)
    assert report["systems"]["B"]["top_k"] == {"1": 0.25, "5": 0.75}


def test_regex_match_mode(tmp_path):
    recs = [{"question": "q", "answers": [r"Bill\s+Clinton"], "ctxs": [ctx("a", "bill  clinton spoke", 1.0)]}]
    f = write(tmp_path / "r.json", recs)
    assert evaluate_qa({"r": f}, tmp_path / "s", ks=[1], match="string", num_resamples=10)["systems"]["r"]["top_k"]["1"] == 0.0
    assert evaluate_qa({"r": f}, tmp_path / "x", ks=[1], match="regex", num_resamples=10)["systems"]["r"]["top_k"]["1"] == 1.0


def test_mismatched_question_sets_refused(tmp_path):
    fa = write(tmp_path / "a.json", system_a())
    other = system_b()
    other[2]["question"] = "q3 changed"
    fb = write(tmp_path / "b.json", other)
    with pytest.raises(DataError) as err:
        evaluate_qa({"A": fa, "B": fb}, tmp_path / "r")
    msg = str(err.value)
    assert str(fa) in msg and str(fb) in msg and "'q3'" in msg
    assert not (tmp_path / "r" / "report.json").exists()


def test_extra_question_refused(tmp_path):
    fa = write(tmp_path / "a.json", system_a())
    fb = write(tmp_path / "b.json", system_b() + [{"question": "q5", "answers": ["x"], "ctxs": filler(2)}])
    with pytest.raises(DataError, match=r"record 4.*'q5'|'q5'.*record 4"):
        evaluate_qa({"A": fa, "B": fb}, tmp_path / "r")


def test_different_answers_refused(tmp_path):
    other = system_b()
    other[0]["answers"] = ["Hilo"]
    fa, fb = write(tmp_path / "a.json", system_a()), write(tmp_path / "b.json", other)
    with pytest.raises(DataError, match="answers for question 'q1' differ"):
        evaluate_qa({"A": fa, "B": fb}, tmp_path / "r")


@pytest.mark.parametrize(
    "mutate, field, where",
    [
        (lambda recs: recs[1].pop("ctxs"), "ctxs", "record 1"),
        (lambda recs: recs[2]["ctxs"][3].update(text=None), "ctxs[3].text", "record 2"),
        (lambda recs: recs[0]["ctxs"][0].update(score="high"), "ctxs[0].score", "record 0"),
        (lambda recs: recs[3].update(answers="ATP"), "answers", "record 3"),
    ],
)
def test_corrupted_results_rejected(tmp_path, mutate, field, where):
    recs = system_a()
    mutate(recs)
    f = write(tmp_path / "bad.json", recs)
    with pytest.raises(DataError) as err:
        evaluate_qa({"bad": f}, tmp_path / "r")
    assert err.value.field == field
    assert str(f) in str(err.value) and where in str(err.value)


def test_truncated_json_rejected(tmp_path):
    f = tmp_path / "cut.json"
    f.write_text(json.dumps(system_a())[:200], encoding="utf-8")
    with pytest.raises(DataError, match="cut.json:1"):
        evaluate_qa({"cut": f}, tmp_path / "r")


def test_empty_results_rejected(tmp_path):
    f = write(tmp_path / "empty.json", [])
    with pytest.raises(DataError, match="no questions"):
        evaluate_qa({"e": f}, tmp_path / "r")


def test_system_names():
    assert system_names(["x/bm25.json", "y/dense.json"]) == ["bm25", "dense"]
    assert system_names(["x/test.json", "y/test.json"]) == ["x/test", "y/test"]
    assert system_names(["a.json", "b.json"], ["one", "two"]) == ["one", "two"]
    with pytest.raises(ValueError):
        system_names(["a.json"], ["one", "two"])


def test_cli_eval(tmp_path):
    fa, fb = write(tmp_path / "bm25.json", system_a()), write(tmp_path / "dense.json", system_b())
    out = tmp_path / "ev"
    proc = run_as_subprocess([str(BIN / "dpr-eval"), f"results=[{fa},{fb}]", f"output_dir={out}", "resamples=100"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert set(report["systems"]) == {"bm25", "dense"}
    assert report["systems"]["bm25"]["top_k"]["1"] == 0.25
    assert report["systems"]["dense"]["top_k"]["100"] == 0.75
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bm25.json", "dense.json", "ev"]  # nothing else in cwd

    bad = write(tmp_path / "bad.json", [{"question": "q1", "answers": ["x"]}])
    proc = run_as_subprocess([str(BIN / "dpr-eval"), f"results=[{bad}]", f"output_dir={out}"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "field 'ctxs'" in proc.stderr and "record 0" in proc.stderr
