"""A finished run directory is never half-overwritten by a later dpr-train (dpr.run_dir)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpr.atomic import sha256_file
from dpr.run_dir import prepare_run_dir
from tests.run_command import run_as_subprocess

BIN = Path(sys.executable).parent


def _env() -> dict:
    env = dict(os.environ, WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    return env


def _cmd(conf: Path, data_dir: Path, model: Path, out: Path, *extra: str) -> list[str]:
    return [str(BIN / "dpr-train"), "--config-dir", str(conf), "data=tiny", f"data_dir={data_dir}",
            f"output_dir={out}", "model=tiny", f"model.name={model}", "train.max_steps=2", "train.batch_size=4",
            "train.hard_negatives=1", "train.val_batch_size=8", *extra]


def _snapshot(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): sha256_file(p) for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "train.log"}


def test_changed_config_refused_and_finished_run_untouched(tiny_model_dir, tiny_data_dir, tmp_path):
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    out = tmp_path / "run"
    base = _cmd(conf, tiny_data_dir, tiny_model_dir, out)
    proc = run_as_subprocess(base, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = _snapshot(out)
    assert ".hydra/config.yaml" in before and "train_summary.json" in before

    # other settings into the finished run: refused in one line that says how to overwrite; before this,
    # the failing run had already rewritten .hydra/config.yaml and deleted the checkpoints
    proc = run_as_subprocess(base + ["train.lr=5e-4"], env=_env(), capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dpr-train")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "train.lr" in lines[0] and "overwrite=true" in lines[0] and "output_dir=" in lines[0]
    assert _snapshot(out) == before and not list(out.glob(".hydra.pending*"))

    # a config that fails its checks leaves the finished run as it was too
    proc = run_as_subprocess(base + ["train.max_steps=0", "train.epochs=0"], env=_env(), capture_output=True,
                             text=True, timeout=300)
    assert proc.returncode == 2 and _snapshot(out) == before

    # the same settings again: allowed (resume/finish), the run stays whole
    proc = run_as_subprocess(base, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # overwrite=true on purpose, killed as soon as it starts training: the directory no longer looks
    # finished (no summary, no old weights), so it cannot pass for a mix of two runs
    proc = subprocess.Popen(base + ["train.lr=5e-4", "overwrite=true", "train.max_steps=400", "train.save_every=1"],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 300
    hydra_cfg = out / ".hydra" / "config.yaml"
    while "lr: 0.0005" not in hydra_cfg.read_text() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.005)  # the new run passed its checks and committed its .hydra/: it is starting
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "train_summary.json").exists() and not (out / "passage_encoder").exists()
    assert "lr: 0.0005" in (out / ".hydra" / "config.yaml").read_text()


def test_prepare_run_dir_states(tmp_path):
    import json

    out = tmp_path / "run"
    conf = {"model": {"name": "m"}, "data": {"name": "d", "mirror_dir": "/a"}, "train": {"lr": 1e-3}, "seed": 1,
            "output_dir": str(out)}
    assert prepare_run_dir(out, conf) == "new"
    out.mkdir()
    (out / "train_summary.json").write_text(json.dumps({"config": conf}))
    (out / "biencoder.json").write_text("{}")
    moved = {**conf, "data": {"name": "d", "mirror_dir": "/elsewhere"}, "logger": {"type": "wandb"}}
    assert prepare_run_dir(out, moved) == "same"  # paths and logging do not change what a run computes
    assert prepare_run_dir(out, {**conf, "seed": 2}, overwrite=True) == "overwritten"
    assert not (out / "train_summary.json").exists() and not (out / "biencoder.json").exists()


def test_other_training_data_is_another_run(tiny_model_dir, tiny_data_dir, tmp_path):
    import json

    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    out = tmp_path / "run"
    base = _cmd(conf, tiny_data_dir, tiny_model_dir, out, "train.validate=false")
    proc = run_as_subprocess(base, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = _snapshot(out)
    train_json = tiny_data_dir / "tiny" / "train.json"
    recorded = json.loads((out / "train_summary.json").read_text())["data_fingerprints"]
    assert recorded["train"] == sha256_file(train_json) and recorded["dev"] == sha256_file(train_json.with_name("dev.json"))

    # the same settings on other data (half the questions): refused, naming the data; before, it logged
    # "same" and replaced the finished run's weights
    other = tmp_path / "other.json"
    other.write_text(json.dumps(json.loads(train_json.read_text())[:4]))
    proc = run_as_subprocess(base + [f"train_file={other}"], env=_env(), capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dpr-train")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "train data: sha256" in lines[0] and "overwrite=true" in lines[0]
    assert _snapshot(out) == before

    # a training file that does not exist: one line, and the finished run's .hydra/ is left as it was
    # (before, .hydra/config.yaml was rewritten before the data was looked for)
    proc = run_as_subprocess(base + [f"train_file={tmp_path / 'missing.json'}"], env=_env(), capture_output=True,
                             text=True, timeout=300)
    assert proc.returncode == 2 and "missing.json" in proc.stderr, proc.stderr[-3000:]
    assert _snapshot(out) == before and not list(out.glob(".hydra.pending*"))

    # the same data under another name is the same run
    same = tmp_path / "copy.json"
    same.write_bytes(train_json.read_bytes())
    proc = run_as_subprocess(base + [f"train_file={same}"], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "run directory" in proc.stderr + proc.stdout and ": same" in proc.stderr + proc.stdout


def test_runs_without_recorded_data_are_compared_on_settings(tmp_path, caplog):
    import json
    import logging

    out = tmp_path / "run"
    out.mkdir()
    conf = {"model": {"name": "m"}, "data": {"name": "d"}, "train": {"lr": 1e-3}, "seed": 1}
    data = {"train": "a" * 64, "dev": None}
    # a run finished before data fingerprints were recorded: usable as it is (settings compared, a note logged)
    (out / "train_summary.json").write_text(json.dumps({"config": conf}))
    with caplog.at_level(logging.INFO, logger="dpr.run_dir"):
        assert prepare_run_dir(out, conf, data=data) == "same"
    assert "recorded no data fingerprints" in caplog.text
    with pytest.raises(ValueError, match="seed"):  # other settings are still refused
        prepare_run_dir(out, {**conf, "seed": 2}, data=data)
    # a run that recorded them: other data is another run, the same data the same one
    (out / "train_summary.json").write_text(json.dumps({"config": conf, "data_fingerprints": data}))
    assert prepare_run_dir(out, conf, data=data) == "same"
    with pytest.raises(ValueError, match="dev data: sha256 None -> bbbbbbbbbbbb"):
        prepare_run_dir(out, conf, data={**data, "dev": "b" * 64})
    assert prepare_run_dir(out, conf, overwrite=True, data={**data, "train": "c" * 64}) == "overwritten"


# --- one run per run directory (two dpr-train into one output_dir both exited 0) ------------------

def _wait_for(cond, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else proc.returncode
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def _holder_of(out: Path) -> str:
    from dpr.run_dir import LOCK_FILE

    f = out / LOCK_FILE
    return f.read_text() if f.is_file() else ""


@pytest.mark.slow
def test_a_second_dpr_train_into_a_running_runs_directory_is_refused(tiny_model_dir, tiny_data_dir, tmp_path):
    """Real processes: A trains; B into A's directory says who holds it (pid, host, since) and exits 2 without
    touching it; A, killed, leaves a stale lock that C takes over (before: B replaced A silently, both exit 0)."""
    import json
    import socket

    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    out = tmp_path / "run"
    base = _cmd(conf, tiny_data_dir, tiny_model_dir, out)
    a = subprocess.Popen(base + ["train.max_steps=100000", "train.save_every=1"], env=_env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (out / "checkpoints").is_dir(), a)  # A holds the lock and is training
        holder = json.loads(_holder_of(out))
        assert holder["pid"] == a.pid and holder["host"] == socket.gethostname() and holder["command"] == "dpr-train"
        hydra_before = (out / ".hydra" / "config.yaml").read_bytes()
        b = subprocess.run(base, env=_env(), capture_output=True, text=True, timeout=300)
        lines = [ln for ln in b.stderr.splitlines() if ln.startswith("dpr-train")]
        assert b.returncode == 2 and len(lines) == 1, b.stderr[-3000:]
        assert f"is in use by another run: pid {a.pid} on {socket.gethostname()} since {holder['since']}" in lines[0]
        assert "another output_dir=" in lines[0]
        assert (out / ".hydra" / "config.yaml").read_bytes() == hydra_before
        assert a.poll() is None and not list(out.glob(".hydra.pending*"))  # A goes on; B left nothing behind
    finally:
        a.kill()
        a.wait(timeout=60)
        a.stderr.close()
    assert json.loads(_holder_of(out))["pid"] == a.pid  # a killed holder's details stay, its flock is gone
    c = subprocess.run(base + ["overwrite=true"], env=_env(), capture_output=True, text=True, timeout=300)
    assert c.returncode == 0, c.stderr[-3000:]
    logged = c.stderr + (out / "train.log").read_text()
    assert f"taking over the lock left by pid {a.pid}" in logged and (out / "train_summary.json").is_file()
    assert _holder_of(out) == ""  # released on exit


def _hold(run: Path, flag: Path) -> subprocess.Popen:
    code = (f"import time; from pathlib import Path; from dpr.run_dir import lock_run_dir\n"
            f"with lock_run_dir({str(run)!r}, 'holder'):\n"
            f"    Path({str(flag)!r}).touch(); time.sleep(120)\n")
    return subprocess.Popen([sys.executable, "-c", code], env=_env(), stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("cmd", [["dpr-rerank", "train"], ["dpr-reader", "train"], ["dpr-train"], ["dpr-pipeline"]])
def test_every_trainer_takes_the_run_directory_lock(tiny_model_dir, tiny_data_dir, tmp_path, cmd):
    run = tmp_path / "run"
    holder = _hold(run, tmp_path / "held")
    try:
        _wait_for((tmp_path / "held").exists, holder)
        before = sorted(p.name for p in run.iterdir())
        args = [str(BIN / cmd[0]), *cmd[1:], "data=tiny", f"data_dir={tiny_data_dir}", f"output_dir={run}",
                f"model.name={tiny_model_dir}" if cmd[0] in ("dpr-train", "dpr-pipeline") else f"model={tiny_model_dir}"]
        conf = tmp_path / "conf"
        (conf / "data").mkdir(parents=True)
        (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
        args += ["--config-dir", str(conf)]
        # the holder is a real process; the refused command runs in-process (its flock is its own open file)
        proc = run_as_subprocess(args, env=_env(), capture_output=True, text=True, timeout=300)
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(cmd[0])]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
        assert f"{run} is in use by another run: pid {holder.pid}" in lines[0] and "(holder)" in lines[0]
        assert sorted(p.name for p in run.iterdir()) == before
    finally:
        holder.kill()
        holder.wait(timeout=60)
        holder.stderr.close()


def test_lock_run_dir_unit(tmp_path, caplog):
    import logging

    from dpr.run_dir import LOCK_FILE, RunDirBusyError, lock_run_dir

    run = tmp_path / "run"
    with lock_run_dir(run, "first"):
        assert '"command": "first"' in (run / LOCK_FILE).read_text()
        # the same process again (another descriptor): flock is per open file, so this is refused too
        with pytest.raises(RunDirBusyError, match=r"in use by another run: pid \d+ on .* since .* \(first\)"):
            with lock_run_dir(run, "second"):
                pass
    assert not run.exists()  # released: the directory it made only for the lock is gone too
    run.mkdir()
    (run / "keep").write_text("a run's file")
    (run / LOCK_FILE).write_text('{"pid": 99999999, "host": "h", "since": "then", "command": "dead"}')
    with caplog.at_level(logging.WARNING, logger="dpr.run_dir"), lock_run_dir(run, "third"):
        assert "taking over the lock left by pid 99999999 on h since then (dead)" in caplog.text
    assert not (run / LOCK_FILE).exists() and (run / "keep").is_file()  # a directory it did not make stays
    f = tmp_path / "a_file"
    f.write_text("x")
    with pytest.raises(NotADirectoryError, match="exists and is not a directory"):
        with lock_run_dir(f, "x"):
            pass
    assert f.read_text() == "x"
