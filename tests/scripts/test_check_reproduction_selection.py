"""scripts/check_reproduction.py never passes vacuously: a selection that compares nothing (``--ks ,``,
``--systems ,``) is one line, exit 2; a qrels report's metrics (nDCG, MRR, recall) are compared, not skipped; a
directory given as a report is one line, not a traceback."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.scripts import script

check = script("check_reproduction")
QA = REPO / "docs" / "results" / "reports" / "squad1_open.json"
QRELS = REPO / "docs" / "results" / "reports" / "nfcorpus_teacher.json"


def cli(*args: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "check_reproduction.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("args, words", [
    (["--ks", ","], "--ks: expected a comma list of whole numbers >= 1"),
    (["--ks", ""], "--ks: expected a comma list"),
    (["--ks", "0,5"], "--ks: expected a comma list of whole numbers >= 1"),
    (["--ks", "five"], "--ks: expected a comma list"),
    (["--systems", ","], "--systems: expected a comma list of at least one name"),
    (["--metrics", " , "], "--metrics: expected a comma list of at least one name"),
])
def test_an_empty_or_bad_selection_is_one_line(args, words):
    rc, out = cli(QA, QA, *args)
    assert rc == 2 and out.count("\n") == 1 and words in out, out
    assert "reproduced" not in out


def test_an_empty_selection_through_the_api_is_refused():
    published = json.loads(QA.read_text())
    with pytest.raises(ValueError, match="nothing to compare: no k selected"):
        check.compare_reports(published, published, ks=[])
    with pytest.raises(ValueError, match="nothing to compare: no system selected"):
        check.compare_reports(published, published, systems=[])
    qrels = json.loads(QRELS.read_text())
    with pytest.raises(ValueError, match="nothing to compare: no metric selected"):
        check.compare_reports(qrels, qrels, metrics=[])


def test_a_qrels_report_is_compared_on_its_metrics(tmp_path):
    """Every metric the published qrels report lists, for every system: a moved nDCG fails, a missing MRR fails."""
    published = json.loads(QRELS.read_text())
    c = check.compare_reports(published, published)
    assert c.ok and len(c.rows) == len(published["systems"]) * len(published["metrics"])
    assert {r.k for r in c.rows} == {"ndcg@10", "mrr@10", "recall@10", "recall@100"}
    got = copy.deepcopy(published)
    got["systems"]["dense"]["ndcg@10"] -= 0.02
    del got["systems"]["bm25"]["mrr@10"]
    c = check.compare_reports(got, published)
    assert {(r.system, r.k) for r in c.failed()} == {("dense", "ndcg@10"), ("bm25", "mrr@10")}
    run = tmp_path / "report.json"
    run.write_text(json.dumps(got))
    rc, out = cli(run, QRELS)
    assert rc == 1 and "| dense | ndcg@10 | 32.8 | 30.8 | -2.00 | FAIL (> 1) |" in out, out
    assert "| bm25 | mrr@10 | 52.0 | missing |" in out
    rc, out = cli(run, QRELS, "--metrics", "recall@100")
    assert rc == 0 and "reproduced: 8 figures of 8 systems" in out, out


@pytest.mark.parametrize("mangle, words", [
    (lambda r: r["systems"]["bm25"].update({"ndcg@10": 31.7}), "systems.bm25.ndcg@10: 31.7 is no metric value"),
    (lambda r: r.pop("metrics"), "field metrics: missing"),
    (lambda r: r.update({"kind": "qa"}), "field systems.bm25.top_k: missing"),
])
def test_a_bad_qrels_report_is_one_line(mangle, words):
    published = json.loads(QRELS.read_text())
    got = copy.deepcopy(published)
    mangle(got)
    with pytest.raises(check.ReportError, match=words):
        check.compare_reports(got, published)


def test_a_qa_run_against_a_qrels_report_is_refused():
    with pytest.raises(check.ReportError, match="field kind: 'qa', but the published report is 'qrels'"):
        check.compare_reports(json.loads(QA.read_text()), json.loads(QRELS.read_text()))


def test_a_directory_as_a_report_is_one_line(tmp_path):
    rc, out = cli(tmp_path, QA)
    assert rc == 2 and out.count("\n") == 1 and f"{tmp_path}: is a directory" in out, out
    rc, out = cli(QA, tmp_path)
    assert rc == 2 and out.count("\n") == 1 and "is a directory" in out, out
