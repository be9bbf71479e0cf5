"""The run lock is on the run directory itself: deleting ``.dpr-run.lock`` by hand no longer lets a second run in,
and a run directory inside a running one (``dpr-train overwrite=true output_dir=<a running pipeline's>/model``) is
refused in one line naming the holder. Real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dpr.run_dir import LOCK_FILE, RunDirBusyError, check_run_dir_free, lock_run_dir

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]


def _holder(run: Path, command: str) -> subprocess.Popen:
    """Another process holding ``run``'s lock until killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from dpr.run_dir import lock_run_dir
        with lock_run_dir({str(run)!r}, {command!r}):
            print("held", flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture()
def pipeline_running(tmp_path):
    run = tmp_path / "pipe"
    proc = _holder(run, "dpr-pipeline")
    try:
        yield run, proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_the_lock_survives_its_file_deleted_by_hand(pipeline_running):
    run, proc = pipeline_running
    (run / LOCK_FILE).unlink()
    with pytest.raises(RunDirBusyError, match=f"{run} is in use by another run: a process that left no details"):
        with lock_run_dir(run, "dpr-pipeline"):
            pytest.fail("two runs hold one directory")
    with pytest.raises(RunDirBusyError):
        check_run_dir_free(run)


def test_a_run_inside_a_running_one_is_refused(pipeline_running):
    run, proc = pipeline_running
    with pytest.raises(RunDirBusyError, match=rf"{run / 'model'} is inside {run}, in use by another run: "
                                              rf"pid {proc.pid} .*\(dpr-pipeline\)"):
        with lock_run_dir(run / "model", "dpr-train"):
            pytest.fail("a trainer wrote the pipeline's model")
    assert not (run / "model").exists()


def test_dpr_train_overwrite_into_a_running_pipelines_model_is_one_line(pipeline_running, tiny_model_dir,
                                                                         tiny_data_dir, tmp_path):
    run, proc = pipeline_running
    (run / "model").mkdir()
    (run / "model" / "biencoder.json").write_text('{"format": "dpr.biencoder", "config": {}}')
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    out = subprocess.run([str(BIN / "dpr-train"), "--config-dir", str(conf), "data=tiny", f"data_dir={tiny_data_dir}",
                          f"output_dir={run / 'model'}", "model=tiny", f"model.name={tiny_model_dir}", "overwrite=true",
                          "train.max_steps=1"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "WANDB_MODE": "disabled"})
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("dpr-train")]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert f"is inside {run}, in use by another run: pid {proc.pid}" in lines[0]
    assert sorted(p.name for p in (run / "model").iterdir()) == ["biencoder.json"]


def test_after_the_holder_dies_the_next_run_takes_over(tmp_path):
    run = tmp_path / "pipe"
    proc = _holder(run, "dpr-pipeline")
    proc.kill()
    proc.wait(timeout=30)
    time.sleep(0.1)
    with lock_run_dir(run / "model", "dpr-train"), lock_run_dir(run, "dpr-pipeline"):
        pass
