"""A user's own file inside an existing output directory, under a name a command writes there (``README.md``,
``metrics.jsonl``, ``bm25/test.json``, ...): refused in one line before any work, exit 2, the file unchanged.
An earlier output of that name (a model card, a metrics log, a results file) is still replaced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpr.atomic import OutputConflictError, check_outputs_inside, write_json_atomic, write_text_atomic
from dpr.output_kinds import INSIDE, foreign_inside
from dpr.run_dir import OUTPUTS_INSIDE, lock_run_dir
from tests.run_command import refusal_line as _one_line, run_command

BIN = Path(sys.executable).parent
USER_README = "# My notes\n\nexperiments I ran by hand\n"
USER_METRICS = '{"accuracy": 0.5, "note": "my own log"}\n'


def _user_dir(root: Path) -> Path:
    d = root / "run"
    d.mkdir()
    (d / "README.md").write_text(USER_README)
    (d / "metrics.jsonl").write_text(USER_METRICS)
    return d


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run_command(args, cwd=cwd)  # the console script's main, in-process


@pytest.mark.parametrize("command", sorted(OUTPUTS_INSIDE))
def test_every_locking_command_refuses_a_user_file_before_any_work(tmp_path, command):
    d = _user_dir(tmp_path)
    if command == "dpr-pipeline":  # the pipeline writes its model card under model/
        (d / "model").mkdir()
        (d / "README.md").rename(d / "model" / "README.md")
    with pytest.raises(OutputConflictError, match="README.md: looks like a text file, not a model card"):
        with lock_run_dir(d, command):
            pytest.fail("the command ran")
    readme = d / ("model/README.md" if command == "dpr-pipeline" else "README.md")
    assert readme.read_text() == USER_README and (d / "metrics.jsonl").read_text() == USER_METRICS
    assert not (d / ".dpr-run.lock").exists()


def test_the_user_metrics_log_is_refused_too(tmp_path):
    d = _user_dir(tmp_path)
    (d / "README.md").unlink()
    with pytest.raises(OutputConflictError, match="metrics.jsonl: looks like a JSON file, not a training metrics log"):
        with lock_run_dir(d, "dpr-rerank train"):
            pass
    assert (d / "metrics.jsonl").read_text() == USER_METRICS


def test_the_project_outputs_of_those_names_are_replaced(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "README.md").write_text("---\nlibrary_name: transformers\ntags:\n- dense-retrieval\n---\n\n# m\n")
    (d / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (d / "validation.jsonl").write_text("")  # an empty file: nothing to lose
    (d / "train_summary.json").write_text(json.dumps({"config": {}, "steps": 3}))
    (d / "notes.txt").write_text("a name no command writes")
    with lock_run_dir(d, "dpr-train"):
        pass
    write_text_atomic(d / "README.md", "---\ntags:\n- dense-retrieval\n---\nnew\n")
    write_json_atomic(d / "bm25_like.json", [])
    assert (d / "README.md").read_text().endswith("new\n")


def test_the_write_path_itself_refuses_a_user_file(tmp_path):
    d = _user_dir(tmp_path)
    (d / "bm25").mkdir()
    (d / "bm25" / "test.json").write_text('[{"question": "q", "positive_ctxs": []}]')
    for path in (d / "README.md", d / "metrics.jsonl"):
        before = path.read_bytes()
        with pytest.raises(OutputConflictError, match=str(path)):
            write_text_atomic(path, "the command's output\n")
        assert path.read_bytes() == before
    with pytest.raises(OutputConflictError, match="a DPR training file, not a DPR results JSON"):
        check_outputs_inside(d, {"bm25/test.json": "dpr_results"})


def test_every_inside_name_recognises_only_its_kind(tmp_path):
    for name in INSIDE:
        p = tmp_path / name
        p.write_text("plain words of the user\n")
        assert foreign_inside(p) is not None, name
        p.write_text("")
        assert foreign_inside(p) is None, name


def test_dpr_train_refuses_in_one_line_with_the_user_files_unchanged(tmp_path, tiny_model_dir):
    d = _user_dir(tmp_path)
    proc = _cli(tmp_path, "dpr-train", f"model.name={tiny_model_dir}", f"output_dir={d}", "data=squad1_open",
                f"data_dir={tmp_path / 'data'}", "train.max_steps=1")
    _one_line(proc, f"{d / 'README.md'}: looks like a text file, not a model card")
    assert (d / "README.md").read_text() == USER_README and (d / "metrics.jsonl").read_text() == USER_METRICS
    assert not (d / "train_summary.json").exists() and not (d / "checkpoints").exists()


def test_dpr_pipeline_refuses_a_user_results_file_under_bm25(tmp_path, tiny_model_dir):
    d = tmp_path / "pipe"
    (d / "bm25").mkdir(parents=True)
    user = '[{"question": "who?", "answers": ["me"], "positive_ctxs": [{"text": "mine"}]}]'
    (d / "bm25" / "test.json").write_text(user)
    proc = _cli(tmp_path, "dpr-pipeline", f"model.name={tiny_model_dir}", f"output_dir={d}", "data=squad1_open",
                f"data_dir={tmp_path / 'data'}")
    _one_line(proc, f"{d / 'bm25' / 'test.json'}: looks like a DPR training file, not a DPR results JSON")
    assert (d / "bm25" / "test.json").read_text() == user
    assert not (d / "stages").exists()


def test_another_models_export_is_refused_naming_its_source(tmp_path):
    """The refusal says whose export stands there (before: "no marker of its output" beside its dpr_export.json)."""
    from dpr.atomic import check_replaceable
    from dpr.export.marker import MARKER, owned_by

    other = tmp_path / "export"
    other.mkdir()
    (other / MARKER).write_text(json.dumps({"exported_by": "dpr-export", "source": str(tmp_path / "run_a")}))
    with pytest.raises(OutputConflictError, match=rf"is a directory this command did not write: an export of another "
                                                  rf"model \({tmp_path / 'run_a'}, as its {MARKER} says\), not of "
                                                  rf"{tmp_path / 'run_b'}"):
        check_replaceable(other, directory=True, owned=owned_by(tmp_path / "run_b"))
    check_replaceable(other, directory=True, owned=owned_by(tmp_path / "run_a"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    with pytest.raises(OutputConflictError, match=r"did not write \(no marker of its output in it\)"):
        check_replaceable(tmp_path / "mine", directory=True, owned=owned_by(tmp_path / "run_b"))


def test_dpr_eval_keeps_a_user_report_in_its_output_dir(tmp_path):
    """dpr-eval writes report.md and report.json into output_dir: a user's own report.md there is refused, and an
    earlier evaluation's is replaced."""
    from dpr.eval.report import evaluate_qa

    results = tmp_path / "bm25.json"
    results.write_text(json.dumps([{"question": "q", "answers": ["a"], "ctxs": [
        {"id": "1", "title": "", "text": "a", "score": 1.0, "has_answer": True}]}]))
    out = tmp_path / "eval"
    out.mkdir()
    (out / "report.md").write_text("# My report\n\nnumbers I computed by hand\n")
    with pytest.raises(OutputConflictError, match="report.md: looks like a text file, not an evaluation report"):
        evaluate_qa({"bm25": results}, out, ks=[1])
    assert (out / "report.md").read_text().startswith("# My report")
    (out / "report.md").unlink()
    evaluate_qa({"bm25": results}, out, ks=[1])
    evaluate_qa({"bm25": results}, out, ks=[1])  # the earlier report is the project's: replaced
    assert json.loads((out / "report.json").read_text())["kind"] == "qa"


def test_a_metrics_log_cut_short_by_a_kill_is_still_the_runs(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "lo')
    assert foreign_inside(tmp_path / "metrics.jsonl") is None


def test_a_read_only_output_directory_is_named_not_a_temporary_path(read_only_dir):
    from dpr.atomic import OutputNotWritableError

    ro = read_only_dir
    with pytest.raises(OutputNotWritableError, match=rf"^{ro}: cannot write index there \(read-only file system\)$"):
        write_text_atomic(ro / "index", "x")
