"""A file output replaces only a file of the kind its command writes: before, `dpr-bm25 output=train.json`
overwrote the user's training file and `dpr-retrieve output=passages.tsv` the corpus. Each command runs in-process
(its console-script ``main`` under a patched ``sys.argv``): refused in one line, exit 2, nothing on disk changed;
and each command's own earlier output, or an empty file, still passes the check."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import faiss
import numpy as np
import pytest

from dpr.atomic import OutputConflictError, check_replaceable
from dpr.output_kinds import foreign

TRAIN = [{"question": "where do owls live", "answers": ["trees"], "positive_ctxs": [
    {"title": "Owl", "text": "owls live in trees", "passage_id": "1"}], "negative_ctxs": [], "hard_negative_ctxs": []}]
RESULTS = [{"question": "where do owls live", "answers": ["trees"], "ctxs": [
    {"id": "1", "title": "Owl", "text": "owls live in trees", "score": 1.0, "has_answer": True}]}]


def _run_cli(monkeypatch, capsys, cwd: Path, command: str, *args: str) -> tuple[int, str]:
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", [command, *args])
    module = importlib.import_module("dpr.cli." + command.removeprefix("dpr-"))
    with pytest.raises(SystemExit) as exc:
        module.main()
    lines = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.startswith("dpr-")]
    return exc.value.code, lines[0] if len(lines) == 1 else "\n".join(lines)


@pytest.fixture()
def place(tmp_path) -> Path:
    """The user's files: a training file, a corpus TSV, a notes file; and the inputs the commands name."""
    (tmp_path / "train.json").write_text(json.dumps(TRAIN, indent=2))
    (tmp_path / "passages.tsv").write_text("id\ttext\ttitle\n1\towls live in trees\tOwl\n")
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "r.json").write_text("[]")
    return tmp_path


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("target, what", [("train.json", "a DPR training file"), ("passages.tsv", "a passages TSV")])
def test_a_user_file_of_another_kind_at_every_file_output_is_refused(monkeypatch, capsys, place, tiny_model_dir,
                                                                      target, what):
    m = str(tiny_model_dir)
    out = f"output={target}"
    commands = [
        ("dpr-data", "export", "data=x", f"data_dir={place}", "format=triples", out),
        ("dpr-bm25", "data=squad1_open", f"data_dir={place}", out),
        ("dpr-bm25", "passages=passages.tsv", "qa=q.tsv", out),
        ("dpr-retrieve", "mode=hybrid", "bm25=r.json", "dense=r.json", out),
        ("dpr-retrieve", f"model={m}", "index=i", "passages=passages.tsv", "qa=q.tsv", out),
        ("dpr-index", "embeddings=e", out),
        ("dpr-rerank", "score", f"model={m}", "results=r.json", out),
        ("dpr-rerank", "teacher-scores", f"model={m}", "data=squad1_open", out),
        ("dpr-reader", "eval", f"model={m}", "results=r.json", out),
    ]
    before = _files(place)
    for cmd in commands:
        code, line = _run_cli(monkeypatch, capsys, place, *cmd)
        assert code == 2 and f"{place / target}: looks like {what}, not " in line, (cmd, line)
        assert "nothing was changed" in line
        assert _files(place) == before, cmd


def _faiss_index(path: Path) -> None:
    index = faiss.index_factory(8, "HNSW4", faiss.METRIC_INNER_PRODUCT)
    index.add(np.random.default_rng(0).random((20, 8), dtype=np.float32))
    faiss.write_index(index, str(path))


@pytest.mark.parametrize("kinds, own, other", [
    (("dpr_results", "trec_run"), "results", "train"),
    (("dpr_results", "trec_run"), "trec", "corpus"),
    (("faiss_index",), "faiss", "results"),
    (("dpr_results", "trec_run", "teacher_scores"), "teacher", "train"),
    (("reader_eval",), "reader", "results"),
    (("training_export",), "flag", "train"),
    (("training_export",), "triples", "results"),
])
def test_own_kind_passes_and_another_is_refused(tmp_path, kinds, own, other):
    """What each command's writer produces (and an empty file) passes; another kind of file is refused."""
    from dpr.data.results import write_results, write_trec_run

    made = {
        "results": lambda p: write_results(p, RESULTS),
        "trec": lambda p: write_trec_run(p, {"q1": {"d1": 2.0, "d2": 1.0}}, tag="bm25"),
        "faiss": _faiss_index,
        "teacher": lambda p: p.write_text(json.dumps({"index": 0, "question": "q", "passage_ids": ["1"],
                                                      "scores": [0.5]}) + "\n"),
        "reader": lambda p: p.write_text(json.dumps({"model": "m", "figures": {}, "predictions": {}}, indent=2)),
        "flag": lambda p: p.write_text(json.dumps({"query": "q", "pos": ["a"], "neg": ["b"]}) + "\n"),
        "triples": lambda p: p.write_text("q\tpos\tneg\n"),
        "train": lambda p: p.write_text(json.dumps(TRAIN)),
        "corpus": lambda p: p.write_text("id\ttext\ttitle\n1\towls live in trees\tOwl\n"),
    }
    check = foreign(kinds)
    path = tmp_path / "out"
    made[own](path)
    check_replaceable(path, directory=False, same_kind=check)
    path.write_bytes(b"")
    check_replaceable(path, directory=False, same_kind=check)
    made[other](path)
    before = path.read_bytes()
    with pytest.raises(OutputConflictError, match="looks like .*, not .*which this command writes there"):
        check_replaceable(path, directory=False, same_kind=check)
    assert path.read_bytes() == before


def test_a_rerun_over_its_own_output_still_works(monkeypatch, capsys, tmp_path, tiny_data_dir):
    """dpr-bm25 standalone, twice onto one output: the second run replaces the first's results."""
    tiny = tiny_data_dir / "tiny"
    args = (f"passages={tiny / 'passages.tsv'}", f"qa={tiny / 'dev.qa.tsv'}", "output=out.json", "k=3")
    for _ in range(2):
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(sys, "argv", ["dpr-bm25", *args])
        from dpr.cli import bm25

        bm25.main()
        assert json.loads((tmp_path / "out.json").read_text())[0]["ctxs"]
