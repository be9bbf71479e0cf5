"""`dpr.stages.StageRunner`: a stage runs once and is skipped while up to date; its inputs' edits and its
parameters re-run it; a run directory moved elsewhere (or named relative instead of absolute) stays up to date,
and markers of the earlier whole-path rule still count."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from dpr.errors import DataError
from dpr.stages import StageRunner, _relative, _run_forms, fingerprint


def _params(run: Path) -> dict:
    """The stage's parameters: the run's paths in them, relative and absolute (as the pipeline's stages carry e.g.
    the teacher's scores path)."""
    return {"k": 5, "scores": str(run / "scores.json"), "abs_scores": str((run / "scores.json").resolve())}


def _stage(run: Path, data: Path, calls: list, params_extra: dict | None = None) -> bool:
    """One stage reading a dataset file and a file of the run, with :func:`_params`, writing a file of the run."""
    out = run / "result.txt"
    params = {**_params(run), **(params_extra or {})}

    def work() -> None:
        calls.append(str(run))
        out.write_text("done", encoding="utf-8")

    return StageRunner(run / "stages").run("stage", work, outputs=[out], inputs=[data, run / "scores.json"],
                                           params=params)


@pytest.fixture()
def layout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run directories named relative to the working directory, as users do
    data = tmp_path / "data" / "train.json"
    data.parent.mkdir()
    data.write_text("[]", encoding="utf-8")
    run = Path("runs") / "a"
    run.mkdir(parents=True)
    (run / "scores.json").write_text("{}", encoding="utf-8")
    return data, run


def test_runs_once_then_skips_and_reruns_on_edits(layout):
    data, run = layout
    calls: list = []
    assert _stage(run, data, calls) and not _stage(run, data, calls)
    data.write_text("[1]", encoding="utf-8")  # an input edited: size and mtime change
    assert _stage(run, data, calls)
    assert _stage(run, data, calls, {"k": 6})  # another parameter
    assert not _stage(run, data, calls, {"k": 6})
    assert len(calls) == 3


def test_a_moved_run_directory_is_up_to_date(layout):
    data, run = layout
    calls: list = []
    assert _stage(run, data, calls)
    moved = Path("elsewhere") / "b"
    moved.parent.mkdir()
    shutil.move(str(run), str(moved))  # a rename: mtimes kept
    assert not _stage(moved, data, calls)  # relative name, new place
    assert not _stage(moved.resolve(), data, calls)  # the same run named by its absolute path
    assert calls == [str(run)]
    (moved / "scores.json").write_text('{"q": 1}', encoding="utf-8")  # an input inside the run still counts
    assert _stage(moved, data, calls)


def test_an_input_outside_the_run_counts_by_its_path(layout):
    data, run = layout
    calls: list = []
    assert _stage(run, data, calls)
    other = data.parent.parent / "data2" / "train.json"
    other.parent.mkdir()
    shutil.copy2(data, other)  # same size and mtime, another dataset path
    assert _stage(run, other, calls)


def test_only_whole_path_components_are_relative():
    forms = _run_forms(Path("runs/a"))
    assert _relative('"runs/a/x.json"', forms) == '"<run>/x.json"'
    assert _relative('"runs/a"', forms) == '"<run>"'
    assert _relative('"' + os.path.abspath("runs/a") + '/m"', forms) == '"<run>/m"'
    for other in ('"runs/ab/x.json"', '"data/runs/a/x.json"', '"my_runs/a/x"'):  # a sibling, a deeper namesake
        assert _relative(other, forms) == other
    assert fingerprint({"p": "runs/ab/x"}, [], "runs/a") != fingerprint({"p": "runs/a/x"}, [], "runs/a")


def test_a_marker_of_the_whole_path_rule_counts_and_is_rewritten(layout):
    data, run = layout
    calls: list = []
    assert _stage(run, data, calls)
    marker = run / "stages" / "stage.json"
    params = _params(run)
    legacy = fingerprint(params, [data, run / "scores.json"])  # no run directory: whole paths
    marker.write_text(json.dumps({"fingerprint": legacy, "seconds": 1.5}), encoding="utf-8")  # an earlier release's
    assert not _stage(run, data, calls)
    assert json.loads(marker.read_text())["fingerprint"] == fingerprint(params, [data, run / "scores.json"], run)
    assert json.loads(marker.read_text())["seconds"] == 1.5
    assert calls == [str(run)]


@pytest.mark.parametrize("content", [b'{"fingerprint": ', b"[1, 2]", b"\xff\xfe{"])  # cut short, a list, not UTF-8
def test_a_broken_marker_is_one_error_naming_it(layout, content):
    """A hand-edited marker: one line naming the file and saying how to run the stage again; nothing runs."""
    data, run = layout
    calls: list = []
    assert _stage(run, data, calls)
    marker = run / "stages" / "stage.json"
    marker.write_bytes(content)
    with pytest.raises(DataError, match="delete it to run the stage again") as err:
        _stage(run, data, calls)
    assert str(err.value).startswith(str(marker)) and "\n" not in str(err.value)
    assert len(calls) == 1


def test_a_one_rank_stage_runs_in_rank_0_alone_and_the_others_wait_for_its_record(tmp_path, monkeypatch):
    """Under a launcher of two processes, a ``one_rank`` stage is run by rank 0; rank 1 does not run it and
    returns once rank 0's record of it is written."""
    import threading

    out = tmp_path / "model.txt"
    calls = []

    def write():
        calls.append(os.environ.get("RANK"))
        out.write_text("saved")

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    waiting = StageRunner(tmp_path / "stages")
    result = {}
    thread = threading.Thread(target=lambda: result.update(ran=waiting.run(
        "save", write, outputs=[out], params={"k": 1}, one_rank=True)))
    thread.start()
    thread.join(timeout=1.5)
    assert thread.is_alive() and not calls  # rank 1 waits and runs nothing
    rank0 = StageRunner(tmp_path / "stages")
    monkeypatch.setenv("RANK", "0")
    assert rank0.run("save", write, outputs=[out], params={"k": 1}, one_rank=True) is True
    thread.join(timeout=30)
    assert not thread.is_alive() and result == {"ran": False} and calls == ["0"]
