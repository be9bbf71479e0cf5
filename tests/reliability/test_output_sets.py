"""Outputs of several files are published as one set: `dpr-eval`'s report.json, report.md and topk.png, and a
reranked list's JSON, TREC run and stats (`dpr-rerank score`, the pipeline's rerank stage). A failure while
writing leaves the previous set byte for byte; a failure between two moves (a kill) leaves a set whose manifest
(report.json, the stats: written last, naming the others by size and hash) does not match, which every reader
refuses in one line instead of using a new file beside an old one."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

import dpr.atomic
from dpr.output_sets import atomic_paths, check_file_manifest, file_manifest
from dpr.errors import DataError
from dpr.eval.report import evaluate_qa, evaluate_qrels, read_report
from dpr.rerank.rerank_file import write_reranked_set
from tests.run_command import refusal_line, run_command


def _results(path: Path, score: float = 1.0) -> Path:
    path.write_text(json.dumps([{"question": f"q{i}", "answers": ["a"], "query_id": f"q{i}", "ctxs": [
        {"id": f"p{i}", "title": "", "text": "a" if i % 2 else "b", "score": score, "has_answer": bool(i % 2)},
        {"id": f"r{i}", "title": "", "text": "a", "score": score / 2, "has_answer": True}]} for i in range(6)]))
    return path


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _fail_after_moves(monkeypatch, n: int, directory: Path) -> None:
    """`dpr.atomic.replace_path` (one rename of one output) fails after ``n`` moves into ``directory`` (writes into
    the set's temporaries do not count): a kill between two moves."""
    real, done = dpr.atomic.replace_path, []

    def replace(new, path, aside):
        if Path(path).parent == directory:
            if len(done) >= n:
                raise OSError(errno.EIO, "killed here")
            done.append(path)
        real(new, path, aside)

    monkeypatch.setattr(dpr.atomic, "replace_path", replace)


def _fail_writing(monkeypatch, target: str, name: str) -> None:
    """``target`` (a writer called inside the set's block) fails on a full disk."""
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", name)

    monkeypatch.setattr(target, full)


def test_the_report_names_its_markdown_and_plot(tmp_path):
    out = tmp_path / "eval"
    evaluate_qa({"bm25": _results(tmp_path / "bm25.json")}, out, ks=[1, 2], num_resamples=20)
    report = read_report(out / "report.json")
    assert set(report["files"]) == {"report.md", "topk.png"}
    assert report["files"] == file_manifest({"report.md": out / "report.md", "topk.png": out / "topk.png"})
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md", "topk.png"]  # no temporaries


def test_a_full_disk_while_writing_the_report_keeps_the_previous_set(tmp_path, monkeypatch):
    out = tmp_path / "eval"
    evaluate_qa({"bm25": _results(tmp_path / "bm25.json")}, out, ks=[1], num_resamples=20)
    before = _files(out)
    _fail_writing(monkeypatch, "dpr.eval.report.json.dump", "report.json")  # the last file, after md and png
    with pytest.raises(OSError, match="No space left"):
        evaluate_qa({"bm25": _results(tmp_path / "bm25.json", 2.0)}, out, ks=[1, 2], num_resamples=20)
    assert _files(out) == before and read_report(out / "report.json")["ks"] == [1]


@pytest.mark.parametrize("moved", [1, 2])
def test_a_report_killed_between_its_moves_is_refused_on_read(tmp_path, monkeypatch, moved):
    out = tmp_path / "eval"
    evaluate_qa({"bm25": _results(tmp_path / "bm25.json")}, out, ks=[1], num_resamples=20)
    _fail_after_moves(monkeypatch, moved, out)  # topk.png (and report.md) moved in, report.json not
    with pytest.raises(OSError, match="killed here"):
        evaluate_qa({"bm25": _results(tmp_path / "bm25.json")}, out, ks=[1, 2], num_resamples=20)
    stale = "topk.png" if moved == 1 else "report.md"
    with pytest.raises(DataError, match=rf"{out / stale}: field 'files': not the file report.json was written with"):
        read_report(out / "report.json")


def test_the_model_card_refuses_a_mixed_report(tmp_path, tiny_model_dir):
    """The card copies topk.png beside facts from report.json: from two evaluations it would show another plot."""
    from dpr.model_card import card_facts

    out = tmp_path / "eval"
    evaluate_qa({"bm25": _results(tmp_path / "bm25.json")}, out, ks=[1], num_resamples=20)
    (out / "topk.png").write_bytes((out / "topk.png").read_bytes() + b"\0")
    from dpr.models import BiEncoderConfig, build_biencoder, save_biencoder

    run = tmp_path / "run"
    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_model_dir)))
    save_biencoder(model, tok, run)
    with pytest.raises(DataError, match="topk.png: field 'files': not the file report.json was written with"):
        card_facts(run, report=out / "report.json")


def _reranked_set(d: Path, score: float = 1.0, stats_name: str = "x.stats.json") -> tuple[Path, Path, Path]:
    d.mkdir(exist_ok=True)
    records = json.loads(_results(d / "in.json", score).read_text())
    paths = d / "x.json", d / "x.trec", d / stats_name
    write_reranked_set(records, *paths, {"weight": 0.0, "score": score})
    return paths


def test_a_reranked_set_names_its_lists(tmp_path):
    js, trec, stats = _reranked_set(tmp_path / "r")
    body = json.loads(stats.read_text())
    assert body["files"] == file_manifest({"x.json": js, "x.trec": trec}) and body["score"] == 1.0


def test_a_full_disk_while_reranking_keeps_the_previous_set(tmp_path, monkeypatch):
    d = tmp_path / "r"
    _reranked_set(d)
    before = _files(d)
    _fail_writing(monkeypatch, "dpr.rerank.rerank_file.write_json", "x.stats.json")
    with pytest.raises(OSError, match="No space left"):
        _reranked_set(d, 2.0)
    assert _files(d) == {**before, "in.json": _files(d)["in.json"]}  # (in.json: this test's own input)


@pytest.mark.parametrize("stats_name", ["x.stats.json", "stats.json"])  # dpr-rerank score's; the pipeline's
def test_a_reranked_set_killed_between_its_moves_is_refused_by_dpr_eval(tmp_path, monkeypatch, stats_name):
    d = tmp_path / "r"
    js, trec, stats = _reranked_set(d, stats_name=stats_name)
    _fail_after_moves(monkeypatch, 1, d)  # the new JSON moved in; the TREC run and the stats are the old ones
    with pytest.raises(OSError, match="killed here"):
        _reranked_set(d, 2.0, stats_name)
    monkeypatch.undo()
    with pytest.raises(DataError, match=rf"{js}: field 'files': not the file {stats_name} was written with"):
        evaluate_qa({"x": js}, tmp_path / "eval", ks=[1], num_resamples=20)
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\tr{i}\t1\n" for i in range(6)))
    with pytest.raises(DataError, match=f"{js}: field 'files'"):  # the TREC run is the old set's, the JSON is not
        evaluate_qrels({"x": trec}, qrels, tmp_path / "eval")
    proc = run_command(["dpr-eval", f"results=[{js}]", f"output_dir={tmp_path / 'eval'}", "resamples=10"], cwd=tmp_path)
    refusal_line(proc, f"{js}: field 'files': not the file {stats_name} was written with")
    assert not (tmp_path / "eval").exists() or not any((tmp_path / "eval").iterdir())


def test_lists_without_a_manifest_are_read_as_before(tmp_path):
    """Results files beside stats written before manifests (or another command's stats) are evaluated as they are."""
    res = _results(tmp_path / "x.json")
    (tmp_path / "x.stats.json").write_text(json.dumps({"weight": 0.0}))
    (tmp_path / "stats.json").write_text("not json")
    assert evaluate_qa({"x": res}, tmp_path / "eval", ks=[1], num_resamples=10)["num_questions"] == 6
    check_file_manifest(tmp_path / "report.json", None, tmp_path, "run it again")


def test_atomic_paths_moves_nothing_when_the_last_output_is_refused(tmp_path):
    (tmp_path / "b").mkdir()  # a directory where the set writes a file: refused before any move
    (tmp_path / "a").write_text("old")
    with pytest.raises(FileExistsError, match="is a directory"):
        with atomic_paths([tmp_path / "a", tmp_path / "b"]) as (a, b):
            a.write_text("new")
            b.write_text("new")
    assert (tmp_path / "a").read_text() == "old"
    with pytest.raises(ValueError, match="named twice"):
        with atomic_paths([tmp_path / "a", tmp_path / "a"]):
            pass
