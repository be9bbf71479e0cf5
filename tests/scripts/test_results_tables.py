"""scripts/results_tables.py: the pages' result tables are written from the runs' report.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts import script

ROOT = Path(__file__).resolve().parents[2]
rt = script("results_tables")

QA = {"kind": "qa", "ks": [1, 5, 20], "systems": {
    "bm25": {"top_k": {"1": 0.766, "5": 0.9174, "20": 0.96}, "ci95": {"1": [0.747, 0.785], "5": [0.9, 0.93], "20": [0.95, 0.97]}},
    "dense": {"top_k": {"1": 0.64, "5": 0.871, "20": 0.955}, "ci95": {"1": [0.62, 0.66], "5": [0.85, 0.89], "20": [0.94, 0.96]}}}}
QRELS = {"kind": "qrels", "metrics": ["ndcg@10", "recall@100"], "systems": {
    "bm25": {"ndcg@10": 0.31812, "recall@100": 0.25, "ci95": {"ndcg@10": [0.3, 0.33], "recall@100": [0.2, 0.3]}}}}


def _page(tmp_path: Path, marker: str, body: str = "") -> str:
    (tmp_path / "r").mkdir(exist_ok=True)
    (tmp_path / "r" / "qa.json").write_text(json.dumps(QA))
    (tmp_path / "r" / "qrels.json").write_text(json.dumps(QRELS))
    return f"# page\n\n<!-- results-table {marker} -->\n{body}<!-- /results-table -->\nafter\n"


def test_qa_table_is_written_from_the_report(tmp_path):
    text = _page(tmp_path, "report=r/qa.json systems=dense,bm25 ks=1,20", "| stale |\n")
    new = rt.rewrite(text, "page.md", root=tmp_path)
    assert new.split("\n")[3:7] == ["| system | top-1 | top-20 |", "|---|---|---|",
                                    "| dense | 64.0 | 95.5 |", "| bm25 | 76.6 | 96.0 |"]
    assert new.endswith("<!-- /results-table -->\nafter\n")
    assert rt.rewrite(new, "page.md", root=tmp_path) == new  # written once, up to date after


def test_intervals_and_qrels_metrics(tmp_path):
    new = rt.rewrite(_page(tmp_path, "report=r/qa.json systems=bm25 ks=5 ci=true"), "p.md", root=tmp_path)
    assert "| bm25 | 91.7 [90.0, 93.0] |" in new
    new = rt.rewrite(_page(tmp_path, "report=r/qrels.json"), "p.md", root=tmp_path)
    assert "| system | ndcg@10 | recall@100 |" in new and "| bm25 | 0.318 | 0.250 |" in new


@pytest.mark.parametrize("marker,message", [
    ("report=r/qa.json systems=hybrid", "systems=['hybrid'] not in r/qa.json"),
    ("report=r/qa.json ks=100", "'100' is not in r/qa.json's figures for bm25"),
    ("report=r/none.json", "report=r/none.json: no such file"),
    ("systems=bm25", "report= is required"),
    ("report=r/qa.json colour=red", "'colour=red' is not one of key=value"),
])
def test_bad_marker_names_page_and_line(tmp_path, marker, message):
    with pytest.raises(rt.TableError, match="^p.md:3: .*" + message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        rt.rewrite(_page(tmp_path, marker), "p.md", root=tmp_path)


def test_unclosed_marker(tmp_path):
    with pytest.raises(rt.TableError, match="p.md:3: results-table marker without its closing"):
        rt.rewrite("x\n\n<!-- results-table report=r/qa.json -->\n| a |\n", "p.md", root=tmp_path)


def test_the_repository_pages_are_up_to_date():
    """The README's and docs/results' tables equal what their committed reports give (a hand-edited figure fails)."""
    for page in rt.pages():
        text = page.read_text()
        assert rt.rewrite(text, str(page.relative_to(ROOT))) == text, f"{page}: run scripts/results_tables.py write"


def test_save_refuses_a_report_whose_markdown_is_another_writes(tmp_path, capsys):
    """A run's report.json names its report.md by size and hash: one left by a dpr-eval killed between its moves is
    refused in one line before anything is copied into docs/results/reports."""
    from dpr.output_sets import file_manifest

    (tmp_path / "report.md").write_text("# Retrieval evaluation\n")
    (tmp_path / "report.json").write_text(json.dumps({**QA, "files": file_manifest({"report.md": tmp_path / "report.md"})}))
    (tmp_path / "report.md").write_text("# Retrieval evaluation\nanother run\n")
    with pytest.raises(SystemExit) as exit_:
        rt.main(["save", str(tmp_path / "report.json"), "never_written"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "report.md" in err
    assert not (rt.REPORTS / "never_written.json").exists()
