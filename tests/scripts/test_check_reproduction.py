"""scripts/check_reproduction.py, CI's reproduction guard: a run's report against the published one, on fake and
perturbed copies of the published squad1_open report (equal passes; a moved figure, a missing system or k fails with
the table of what moved; an unreadable report is one line, exit 2), and the guard's command is the README's."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.scripts import script

check = script("check_reproduction")
PUBLISHED = REPO / "docs" / "results" / "reports" / "squad1_open.json"


@pytest.fixture()
def published() -> dict:
    return json.loads(PUBLISHED.read_text(encoding="utf-8"))


def moved(report: dict, system: str, k: int, points: float) -> dict:
    out = copy.deepcopy(report)
    out["systems"][system]["top_k"][str(k)] += points / 100
    return out


def run_cli(tmp_path: Path, got: dict, expected: dict, *args: str) -> tuple[int, str]:
    a, b = tmp_path / "report.json", tmp_path / "published.json"
    a.write_text(json.dumps(got))
    b.write_text(json.dumps(expected))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "check_reproduction.py"), str(a), str(b), *args],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_published_report_reproduces_itself(published, tmp_path):
    c = check.compare_reports(published, published)
    assert c.ok and not c.moved()
    # every published system at top-1/5/20/100
    assert {(r.system, r.k) for r in c.rows} == {(s, k) for s in published["systems"] for k in (1, 5, 20, 100)}
    rc, out = run_cli(tmp_path, published, published)
    assert rc == 0 and "reproduced: 20 figures of 5 systems within ±1 point" in out and "|" not in out


def test_a_figure_moved_beyond_the_tolerance_fails_with_the_table(published, tmp_path):
    got = moved(moved(published, "dense", 5, -1.5), "bm25", 1, 0.3)
    c = check.compare_reports(got, published)
    assert not c.ok and [(r.system, r.k) for r in c.failed()] == [("dense", 5)]
    rc, out = run_cli(tmp_path, got, published)
    assert rc == 1, out
    assert "| dense | top-5 | 87.1 | 85.6 | -1.50 | FAIL (> 1) |" in out
    assert "| bm25 | top-1 | 76.6 | 76.9 | +0.30 | ok |" in out  # moved within the tolerance: shown, not failed
    assert "NOT reproduced: 1 of 20 figures" in out


def test_within_the_tolerance_passes_and_the_bound_is_inclusive(published):
    assert check.compare_reports(moved(published, "hybrid", 100, -1.0), published).ok
    assert not check.compare_reports(moved(published, "hybrid", 100, -1.01), published).ok
    assert check.compare_reports(moved(published, "hybrid", 100, -1.5), published, tolerance=2.0).ok
    # only the guarded ks: top-10 may move
    assert check.compare_reports(moved(published, "hybrid", 10, -5.0), published).ok


def test_a_missing_system_or_k_fails(published, tmp_path):
    got = copy.deepcopy(published)
    del got["systems"]["hybrid_rrf"]
    del got["systems"]["dense"]["top_k"]["20"]
    c = check.compare_reports(got, published)
    assert {(r.system, r.k) for r in c.failed()} == {("hybrid_rrf", k) for k in (1, 5, 20, 100)} | {("dense", 20)}
    rc, out = run_cli(tmp_path, got, published)
    assert rc == 1 and "| hybrid_rrf | top-1 | 77.1 | missing |  | FAIL (> 1) |" in out
    # a system only the run has is not compared
    extra = copy.deepcopy(published)
    extra["systems"]["new"] = extra["systems"]["bm25"]
    assert check.compare_reports(extra, published).ok


@pytest.mark.parametrize("mangle,needle", [
    (lambda r: r.pop("systems"), "run: field systems: missing or empty"),
    (lambda r: r["systems"]["bm25"].pop("top_k"), "run: field systems.bm25.top_k: missing"),
    (lambda r: r["systems"]["bm25"]["top_k"].update({"5": float("nan")}), "systems.bm25.top_k.5: nan is no accuracy"),
    (lambda r: r["systems"]["bm25"]["top_k"].update({"5": 91.7}), "systems.bm25.top_k.5: 91.7 is no accuracy"),
])
def test_a_report_that_cannot_be_read_is_one_line(published, tmp_path, mangle, needle):
    got = copy.deepcopy(published)
    mangle(got)
    with pytest.raises(check.ReportError, match=re.escape(needle)):
        check.compare_reports(got, published)


def test_the_cli_names_an_unreadable_file_in_one_line(published, tmp_path):
    rc, out = run_cli(tmp_path, published, published, "--tolerance", "nan")
    assert rc == 2 and out.count("\n") == 1 and "tolerance must be a finite number" in out
    (tmp_path / "broken.json").write_text("{")
    assert check.main([str(tmp_path / "broken.json"), str(PUBLISHED)]) == 2
    assert check.main([str(tmp_path / "absent.json"), str(PUBLISHED)]) == 2


def test_a_run_report_whose_markdown_is_another_writes_is_refused(published, tmp_path, capsys):
    """A run's report.json names its report.md by size and hash (dpr-eval's one set): a report.md left by a
    dpr-eval killed between its moves, or copied in, is refused in one line instead of compared."""
    from dpr.output_sets import file_manifest

    run = tmp_path / "eval"
    run.mkdir()
    (run / "report.md").write_text("# Retrieval evaluation\n")
    (run / "report.json").write_text(json.dumps({**published, "files": file_manifest({"report.md": run / "report.md"})}))
    assert check.main([str(run / "report.json"), str(PUBLISHED)]) == 0
    capsys.readouterr()
    (run / "report.md").write_text("# Retrieval evaluation\nanother run\n")
    assert check.main([str(run / "report.json"), str(PUBLISHED)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "report.md" in err and "run dpr-eval again" in err


def _readme_main_command() -> str:
    """The README's main job, from its first code block: the dpr-pipeline line after the set-up."""
    block = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S).group(1)
    joined = re.sub(r"\\\n\s*", "", block)
    line = next(ln for ln in joined.splitlines() if "dpr-pipeline" in ln)
    return line.split("&&", 1)[1].strip()  # after `bash scripts/setup.sh &&` (.ci/run has set up already)


def test_ci_runs_the_readme_main_command_and_checks_its_report():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    command = _readme_main_command()
    assert command.startswith("DPR_DATA_MIRROR=") and "dpr-pipeline data=squad1_open" in command
    assert command in re.sub(r"\\\n\s*", "", ci), "CI must run the README's main command as the README writes it"
    assert "scripts/check_reproduction.py runs/squad1_open/eval/report.json docs/results/reports/squad1_open.json" in ci


def test_the_reproduction_page_states_the_tolerance_and_the_command():
    page = (REPO / "docs" / "results" / "reproduction.md").read_text(encoding="utf-8")
    assert f"±{check.DEFAULT_TOLERANCE:.1f} point" in page
    assert _readme_main_command() in re.sub(r"\\\n\s*", "", page)
    assert "report=docs/results/reports/squad1_open.json" in page  # its table is written from the published report
