"""`dpr-pipeline` relaunches itself under torchrun (``nproc_per_node``, dpr/launch.py): when, how, and that the
relaunched run is the one an explicit ``torchrun`` gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dpr.launch import processes_to_launch, run_forwarding_signals, torchrun_command

BIN = Path(sys.executable).parent
RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
            "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_ID")


def _no_gpu_asked() -> int:
    raise AssertionError("a rank must not count GPUs: it never relaunches")


def test_a_rank_never_relaunches():
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    assert processes_to_launch("auto", torchrun, _no_gpu_asked)[0] == 1
    assert processes_to_launch(2, torchrun, _no_gpu_asked)[0] == 1  # the relaunched ranks themselves
    assert processes_to_launch(8, {"RANK": "3"}, _no_gpu_asked)[0] == 1
    srun = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}  # one srun task, 8 GPUs
    assert processes_to_launch("auto", srun, lambda: 8)[0] == 1  # srun starts the ranks
    assert processes_to_launch(4, srun, lambda: 8) == (
        1, "an srun task (SLURM_STEP_NUM_TASKS=1): srun starts the ranks")


def test_auto_is_one_rank_per_gpu_and_an_integer_forces_it():
    assert processes_to_launch("auto", {}, lambda: 0)[0] == 1  # the CPU
    assert processes_to_launch("auto", {}, lambda: 1)[0] == 1  # one GPU: no launcher needed
    assert processes_to_launch("auto", {}, lambda: 8) == (8, "nproc_per_node=auto: 8 GPUs visible")
    assert processes_to_launch(2, {}, _no_gpu_asked)[0] == 2  # 2 gloo ranks on the CPU
    assert processes_to_launch(1, {}, _no_gpu_asked)[0] == 1
    batch_shell = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "7"}  # sbatch's shell, not an srun task
    assert processes_to_launch("auto", batch_shell, lambda: 4)[0] == 4


@pytest.mark.parametrize("bad", [0, -1, 1025, "two", 1.5, True, None])
def test_bad_values_are_named(bad):
    with pytest.raises(ValueError, match=r"nproc_per_node must be auto or an integer in \[1, 1024\]"):
        processes_to_launch(bad, {}, _no_gpu_asked)


def test_the_relaunch_command():
    cmd = torchrun_command(4, "dpr.cli.pipeline", ["data=x", "train.lr=1e-5"])
    assert cmd == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m",
                   "dpr.cli.pipeline", "data=x", "train.lr=1e-5"]


CHILD = """
import pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda s, f: (out.write_text(str(s)), sys.exit(7)))
out.with_suffix(".ready").write_text("")
time.sleep(60)
"""


def test_signals_reach_the_child_and_its_status_comes_back(tmp_path):
    got = tmp_path / "got"
    before = signal.getsignal(signal.SIGTERM)

    def terminate_me_when_ready() -> None:
        deadline = time.monotonic() + 30
        while not got.with_suffix(".ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)  # to this process: the forwarding handler passes it on

    threading.Thread(target=terminate_me_when_ready, daemon=True).start()
    status = run_forwarding_signals([sys.executable, "-c", CHILD, str(got)])
    assert got.read_text() == str(int(signal.SIGTERM)) and status == 7
    assert signal.getsignal(signal.SIGTERM) is before  # this process's handler is back

    killed = run_forwarding_signals([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert killed == 128 + signal.SIGKILL


def test_a_bad_value_is_refused_before_anything_starts(tiny_data_dir, tiny_model_dir, tmp_path):
    from tests.run_command import refusal_line
    from tests.system.test_pipeline import _pipeline

    proc = _pipeline(tiny_data_dir, tiny_model_dir, tmp_path / "run", "nproc_per_node=many", in_process=True)
    refusal_line(proc, "nproc_per_node", "many")
    assert "launching" not in proc.stdout + proc.stderr and not (tmp_path / "run" / "stages").exists()


@pytest.fixture
def relaunches(monkeypatch):
    """Each relaunch `dpr-pipeline` asks for, as ``(nproc, argv, cwd)``, with the run directory's lock taken (and
    given back) while it is asked: the command itself must hold no lock then. Nothing is started."""
    import dpr.cli.pipeline as cli
    from dpr.run_dir import lock_run_dir

    asked = []

    def spy(nproc, module, argv, why, cwd=None):
        out = next(a.split("=", 1)[1] for a in argv if a.startswith("output_dir="))
        with lock_run_dir(out, "test"):  # refused if the command held it
            asked.append((nproc, list(argv), str(cwd)))
        return 0

    monkeypatch.setattr(cli, "relaunch", spy)
    return asked


def test_the_command_relaunches_with_its_arguments_and_no_lock(tiny_data_dir, tmp_path, relaunches):
    from tests.run_command import run_command

    given = ["data.name=tiny", f"data_dir={tiny_data_dir}", f"output_dir={tmp_path / 'run'}", "teacher.max_negatives=2",
             "nproc_per_node=2"]
    proc = run_command(["dpr-pipeline", *given], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert relaunches == [(2, given, str(tmp_path))]  # as typed (teacher.X included), from where it was typed
    assert not (tmp_path / "run" / "stages").exists()  # the command ran no stage itself


def test_each_job_of_a_sweep_relaunches_alone(tiny_data_dir, tmp_path, relaunches):
    from tests.run_command import run_command

    given = ["data.name=tiny", f"data_dir={tiny_data_dir}", f"output_dir={tmp_path / 'run'}", "nproc_per_node=2"]
    proc = run_command(["dpr-pipeline", "-m", *given, "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [(n, sorted(argv)) for n, argv, _ in relaunches] == [
        (2, sorted([*given, f"seed={seed}"])) for seed in (1, 2)]  # its own overrides, no -m, no sweep settings


TINY = ["data.name=tiny", "data.kind=qa", "data.recipe=none", "model.shared=false", "model.pooling=cls",
        "model.similarity=dot", "train.max_steps=4", "train.batch_size=4", "train.hard_negatives=1",
        "train.save_every=0", "train.val_max_questions=4", "train.frozen_steps=2", "bm25.num_negatives=3",
        "retrieve.k=5", "encode.batch_size=4"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RANK_ENV}
    return dict(env, OMP_NUM_THREADS="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")


def _torchrun(data_dir: Path, model_dir: Path, out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(BIN / "dpr-pipeline"), *TINY, f"data_dir={data_dir}", f"output_dir={out}", f"model.name={model_dir}"]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)


def _systems(out: Path) -> dict:
    """Each system's figures in the run's report (not where its results file lies)."""
    return {name: {k: v for k, v in system.items() if k != "file"}
            for name, system in json.loads((out / "eval" / "report.json").read_text())["systems"].items()}


@pytest.mark.slow
def test_relaunched_run_is_the_explicit_torchrun_run(tiny_data_dir, tiny_model_dir, tmp_path):
    """``dpr-pipeline ... nproc_per_node=2`` relaunches itself as 2 gloo ranks: both ranks encode, and its stage
    records (settings, inputs, outputs of every stage) are the ones an explicit torchrun computes: a torchrun over
    its run directory skips every stage and leaves the report as it was."""
    out = tmp_path / "self"
    proc = subprocess.run([str(BIN / "dpr-pipeline"), *TINY, f"data_dir={tiny_data_dir}", f"output_dir={out}",
                           f"model.name={tiny_model_dir}", "nproc_per_node=2"],
                          env=_env(), capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "nproc_per_node=2: launching 2 processes on this machine" in log
    assert "--standalone --nproc_per_node=2 -m dpr.cli.pipeline" in log
    for rank in (0, 1):
        assert f"shard {rank}/2: 4 passages" in log  # each rank encoded its half of the 8 passages
    # every stage's record holds what it wrote, the stages every rank runs included (rank 0 records them once every
    # rank is done), and no rank's token is left
    markers = {m.name: json.loads(m.read_text()) for m in (out / "stages").glob("*.json")}
    assert markers and all("outputs" in m for m in markers.values()), sorted(n for n, m in markers.items()
                                                                          if "outputs" not in m)
    assert not list((out / "stages").glob(".*.done.*"))
    first = _systems(out)

    again = _torchrun(tiny_data_dir, tiny_model_dir, out)  # an explicit torchrun over the relaunched run's directory
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-4000:]
    assert "] running" not in log and "up to date, skipping" in log  # every stage recorded as torchrun records it
    assert _systems(out) == first


def _processes_naming(text: str) -> list[int]:
    """The pids of the processes whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile
                continue
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
def test_ctrl_c_stops_the_relaunched_ranks(tiny_data_dir, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([str(BIN / "dpr-pipeline"), *TINY, f"data_dir={tiny_data_dir}", f"output_dir={out}",
                             f"model.name={tiny_model_dir}", "nproc_per_node=2"],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:  # until a rank runs a stage
        seen.append(line)
        if "] running" in line:
            break
    assert len(_processes_naming(f"output_dir={out}")) >= 3, "".join(seen)  # the command and its 2 ranks at least
    proc.send_signal(signal.SIGINT)  # to the command alone, as `kill -INT` would
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, "".join(seen) + rest
    assert "signals SIGINT passed on to pid" in rest  # the command passed it on, then torchrun stopped
    deadline = time.monotonic() + 30
    while _processes_naming(f"output_dir={out}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_naming(f"output_dir={out}") == [], "".join(seen) + rest  # no rank left behind


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_command_takes_its_torchrun_with_it(tmp_path):
    """SIGKILL to the command (no handler can pass it on): what it started gets SIGTERM and stops, not run on
    orphaned."""
    parent = ("import sys; from dpr.launch import run_forwarding_signals; "
              "run_forwarding_signals([sys.executable, '-c', "
              "\"import os, time; print(os.getpid(), flush=True); time.sleep(120)\"])")
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, env=_env())
    child = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
    if not gone:
        os.kill(child, signal.SIGKILL)
    assert gone, "the command's child outlived it"
