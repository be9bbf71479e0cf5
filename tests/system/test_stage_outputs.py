"""A stage's record says what it wrote (`dpr.stages.output_state`): a stage whose outputs were rewritten by something
else since (``dpr-train overwrite=true output_dir=<a pipeline's model/>``) is refused in one line naming them, with
nothing changed, instead of being called up to date; records without that field still count; and ``dense.dims`` at the
model's full size is refused before any stage runs."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from dpr.atomic import sha256_file
from dpr.stages import StageOutputsChanged, StageRunner
from tests.run_command import refusal_line, run_as_subprocess


def _model_stage(run: Path, calls: list, *, data: Path | None = None, force: bool = False) -> bool:
    """A stage writing a model-like directory (a marker file and a tower folder), as the pipeline's train stage."""
    model = run / "model"

    def work() -> None:
        calls.append(1)
        (model / "passage").mkdir(parents=True, exist_ok=True)
        (model / "passage" / "weights.bin").write_bytes(b"w" * 64)
        (model / "biencoder.json").write_text('{"dim": 8}', encoding="utf-8")

    return StageRunner(run / "stages", force=force).run(
        "train", work, outputs=[model / "biencoder.json", model / "passage"], inputs=[data] if data else [],
        params={"lr": 1e-3})


def _rewrite(path: Path, content: bytes) -> None:
    """Another program writing ``path``: the same size may come back, but not the same mtime."""
    path.write_bytes(content)
    later = path.stat().st_mtime_ns + 2_000_000_000
    os.utime(path, ns=(later, later))


def _snapshot(root: Path) -> dict[str, str]:
    """Every file's hash, dot-files (the run lock's note of its holder) aside."""
    return {str(p.relative_to(root)): sha256_file(p) for p in sorted(root.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)}


def test_a_rewritten_output_is_refused_naming_its_directory_and_nothing_changes(tmp_path):
    run, calls = tmp_path / "run", []
    assert _model_stage(run, calls) and not _model_stage(run, calls)
    _rewrite(run / "model" / "passage" / "weights.bin", b"u" * 64)  # same size: a foreign model of the same shape
    before = _snapshot(run)
    with pytest.raises(StageOutputsChanged) as err:
        _model_stage(run, calls)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{run / 'model'}: ") and "rewritten by something else" in line
    assert "remove it" in line and "force=true" in line
    assert calls == [1] and _snapshot(run) == before  # neither run over nor re-recorded

    shutil.rmtree(run / "model")  # the way out the line names: the stage runs again
    assert _model_stage(run, calls) and calls == [1, 1]
    assert not _model_stage(run, calls)


def test_force_runs_the_stage_over_rewritten_outputs(tmp_path):
    run, calls = tmp_path / "run", []
    assert _model_stage(run, calls)
    _rewrite(run / "model" / "biencoder.json", b'{"dim": 9}')
    assert _model_stage(run, calls, force=True) and calls == [1, 1]
    assert not _model_stage(run, calls)


def test_changed_inputs_run_the_stage_again_over_its_outputs(tmp_path):
    """The documented rule for a stage whose inputs changed is unchanged: it runs and replaces its outputs."""
    run, calls = tmp_path / "run", []
    data = tmp_path / "train.json"
    data.write_text("[]", encoding="utf-8")
    assert _model_stage(run, calls, data=data)
    _rewrite(run / "model" / "biencoder.json", b'{"dim": 9}')
    data.write_text("[1]", encoding="utf-8")
    assert _model_stage(run, calls, data=data) and calls == [1, 1]
    assert (run / "model" / "biencoder.json").read_text() == '{"dim": 8}'


def test_a_record_without_outputs_counts_and_gains_them(tmp_path):
    run, calls = tmp_path / "run", []
    assert _model_stage(run, calls)
    marker = run / "stages" / "train.json"
    recorded = json.loads(marker.read_text())
    assert set(recorded["outputs"]) == {"<run>/model/biencoder.json", "<run>/model/passage"}
    marker.write_text(json.dumps({k: v for k, v in recorded.items() if k != "outputs"}))  # an earlier release's
    assert not _model_stage(run, calls) and calls == [1]  # up to date, as before
    assert json.loads(marker.read_text())["outputs"] == recorded["outputs"]
    _rewrite(run / "model" / "biencoder.json", b'{"dim": 9}')
    with pytest.raises(StageOutputsChanged):
        _model_stage(run, calls)


def test_a_run_moved_keeping_mtimes_and_dot_files_inside_outputs_stay_up_to_date(tmp_path):
    run, calls = tmp_path / "run", []
    assert _model_stage(run, calls)
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(str(run), str(moved))
    shutil.copytree(moved, tmp_path / "copy")  # copy2: mtimes kept (cp -a)
    (moved / "model" / "passage" / ".lock").write_text("pid 1")  # a lock or temporary file: not an output
    for where in (moved, tmp_path / "copy"):
        assert not _model_stage(where, calls)
    assert calls == [1]


def test_stages_every_rank_runs_record_no_outputs_and_one_rank_stages_do(tmp_path, monkeypatch):
    """Under a launcher the environment does not name every rank writes an every-rank stage's outputs, so none
    records them (the last writer is unknown; tests/test_stages_every_rank.py: a named launch records them); rank 0
    alone runs a one_rank stage and records them."""
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    run = tmp_path / "run"
    run.mkdir()
    out = run / "x.txt"
    runner = StageRunner(run / "stages")
    runner.run("every", lambda: out.write_text("a"), outputs=[out])
    runner.run("one", lambda: out.write_text("b"), outputs=[out], one_rank=True)
    assert "outputs" not in json.loads((run / "stages" / "every.json").read_text())
    assert "outputs" in json.loads((run / "stages" / "one.json").read_text())


@pytest.mark.slow
def test_a_pipeline_model_replaced_by_dpr_train_is_refused_not_reported_up_to_date(tiny_data_dir, tiny_model_dir,
                                                                                  tmp_path):
    from tests.system.test_pipeline import _pipeline

    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, in_process=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    env = {**os.environ, "WANDB_MODE": "disabled"}
    time.sleep(0.01)  # the foreign model's files get mtimes of their own on coarse clocks too
    proc = run_as_subprocess(["dpr-train", "--config-dir", str(conf), "data=tiny", f"data_dir={tiny_data_dir}",
                              f"output_dir={out / 'model'}", "model=tiny", f"model.name={tiny_model_dir}",
                              "train.max_steps=1", "train.batch_size=4", "train.hard_negatives=1",
                              "train.val_batch_size=8", "overwrite=true"], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = _snapshot(out)
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, in_process=True)
    refusal_line(proc, str(out / "model"), "rewritten by something else", "train")
    assert _snapshot(out) == before


@pytest.mark.parametrize("override", ["dense.dims=[32]", "dense.dims=[16,32]"])
def test_dense_dims_at_the_model_size_is_one_line_before_any_stage(tiny_data_dir, tiny_model_dir, tmp_path,
                                                                    override):
    from tests.system.test_pipeline import _pipeline

    out = tmp_path / "run"
    proc = _pipeline(tiny_data_dir, tiny_model_dir, out, override, in_process=True)
    refusal_line(proc, "dense.dims", "32", "full size")
    assert not (out / "stages").exists() or not any((out / "stages").iterdir())
