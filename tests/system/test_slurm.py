"""An ``srun`` step is a launcher: Slurm's variables become ranks (dpr/slurm.py), and two processes started with
nothing but Slurm's variables (no torchrun) form a process group whose gathers work."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpr.slurm import adopt_slurm_env, expand_nodelist, master_port, tasks_per_node, torchrun_env_from_slurm

HERE = Path(__file__).resolve().parent

# What srun gives task 5 of a 16-task step over two nodes of 8 (job 123456, its third step).
SRUN_TASK = {"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "2", "SLURM_PROCID": "13", "SLURM_LOCALID": "5",
             "SLURM_NODEID": "1", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "16",
             "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_STEP_NODELIST": "gpu[07-08]",
             "SLURM_JOB_NODELIST": "gpu[03,07-08]", "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.3"}


def test_srun_task_maps_to_torchrun_ranks():
    assert torchrun_env_from_slurm(SRUN_TASK) == {
        "RANK": "13", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8",
        "MASTER_ADDR": "gpu07",  # the step's first node, not the job's, nor the node srun was typed on
        "MASTER_PORT": str(20000 + 10 * 456 + 2)}


def test_master_falls_back_to_the_job_list_then_the_launch_node():
    env = {k: v for k, v in SRUN_TASK.items() if k != "SLURM_STEP_NODELIST"}
    assert torchrun_env_from_slurm(env)["MASTER_ADDR"] == "gpu03"
    env.pop("SLURM_JOB_NODELIST")
    assert torchrun_env_from_slurm(env)["MASTER_ADDR"] == "10.0.0.3"
    env.pop("SLURM_LAUNCH_NODE_IPADDR")
    with pytest.raises(ValueError, match="export MASTER_ADDR"):
        torchrun_env_from_slurm(env)


def test_the_port_is_shared_by_a_step_and_differs_between_steps():
    assert master_port("123456", "2") == master_port("123456", "2") != master_port("123456", "3")
    assert master_port("123456", "2") != master_port("123457", "2")
    assert all(20000 <= master_port(str(j), str(s)) < 30000 for j in (0, 999, 10**9 + 7) for s in (0, 9, 12))


def test_adopt_sets_torchrun_vars_and_keeps_what_the_user_exported():
    env = dict(SRUN_TASK, MASTER_PORT="29555")
    assert adopt_slurm_env(env) is True
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == (
        "13", "16", "5", "gpu07", "29555")
    assert adopt_slurm_env(env) is False  # the second call: RANK is there now


def test_torchrun_wins_over_slurm():
    env = dict(SRUN_TASK, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="node-a", MASTER_PORT="29500")
    before = dict(env)
    assert adopt_slurm_env(env) is False and env == before


@pytest.mark.parametrize("drop, extra", [
    ("SLURM_STEP_NUM_TASKS", {}),  # a batch script's own shell: SLURM_NTASKS=16 but one process
    (None, {"SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}),  # a one-task step (a submitit job, an array task)
    ("SLURM_PROCID", {}),  # not a Slurm task at all
])
def test_not_a_rank(drop, extra):
    env = {k: v for k, v in SRUN_TASK.items() if k != drop} | extra
    assert torchrun_env_from_slurm(env) == {}
    assert adopt_slurm_env(env) is False and "RANK" not in env


@pytest.mark.parametrize("key, value, match", [
    ("SLURM_PROCID", "16", "SLURM_PROCID=16 outside 0..15"),
    ("SLURM_STEP_NUM_TASKS", "many", "SLURM_STEP_NUM_TASKS='many': not an integer"),
    ("SLURM_STEP_NODELIST", "gpu[07-", "SLURM_STEP_NODELIST='gpu\\[07-'"),
    ("SLURM_STEP_TASKS_PER_NODE", "8(2)", "SLURM_STEP_TASKS_PER_NODE: bad tasks-per-node entry"),
])
def test_bad_values_name_the_variable(key, value, match, monkeypatch):
    monkeypatch.setenv("PATH", "")  # no scontrol to fall back on
    with pytest.raises(ValueError, match=match):
        torchrun_env_from_slurm(SRUN_TASK | {key: value})


@pytest.mark.parametrize("text, hosts", [
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a1,b[8-10],c", ["a1", "b8", "b9", "b10"] + ["c"]),
    ("r[1-2]-n[1,3]", ["r1-n1", "r1-n3", "r2-n1", "r2-n3"]),
    ("gpu-[099-101]", ["gpu-099", "gpu-100", "gpu-101"]),
])
def test_nodelist_examples(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["", "(null)", "n[3-1]", "n[1-2", "n]1[", "a,,b", "n[x]"])
def test_nodelist_refuses(text):
    with pytest.raises(ValueError):
        expand_nodelist(text)


def test_tasks_per_node():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1] and tasks_per_node("8") == [8]
    with pytest.raises(ValueError, match="bad tasks-per-node entry"):
        tasks_per_node("2(3)")


def compress(hosts: list[tuple[str, int, int]]) -> str:
    """Slurm's compressed form of hosts given as (prefix, number, width): runs of one prefix and width joined in
    one bracket group, consecutive numbers as ranges."""
    groups: list[tuple[str, int, list[int]]] = []
    for prefix, n, width in hosts:
        if groups and groups[-1][:2] == (prefix, width):
            groups[-1][2].append(n)
        else:
            groups.append((prefix, width, [n]))
    parts = []
    for prefix, width, nums in groups:
        ranges, start = [], 0
        for i in range(1, len(nums) + 1):
            if i == len(nums) or nums[i] != nums[i - 1] + 1:
                lo, hi = nums[start], nums[i - 1]
                ranges.append(str(lo).zfill(width) + ("" if lo == hi else "-" + str(hi).zfill(width)))
                start = i
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)


host = st.tuples(st.sampled_from(["node", "gpu-", "a100n", "r1c"]), st.integers(0, 999), st.integers(1, 4))


@settings(max_examples=200, deadline=None)
@given(st.lists(host, min_size=1, max_size=30))
def test_nodelist_roundtrip(hosts):
    """Any list of hosts, compressed as Slurm writes it, expands back to the same names in the same order."""
    hosts = [(p, n, w) for p, n, w in hosts if len(str(n)) <= w] or [("node", 1, 1)]
    names = [f"{p}{str(n).zfill(w)}" for p, n, w in hosts]
    assert expand_nodelist(compress(hosts)) == names
    assert expand_nodelist(",".join(names)) == names  # the uncompressed form reads as itself


def free_slurm_job_id() -> int:
    """A job id whose derived port is free on this machine (the port rule: 20000 + 10 * (id mod 1000) + step)."""
    for job in range(1000 + os.getpid() % 1000, 2000 + os.getpid() % 1000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", master_port(str(job), "0")))
            except OSError:
                continue
            return job
    pytest.skip("no free port in 20000..29999")


def test_two_srun_tasks_without_torchrun_gather(tmp_path):
    """Two processes started as srun would start them (Slurm's variables only, the master from the compressed
    node list, the port from the job id): a gloo group forms and the gathers give what torchrun's run gives."""
    job = free_slurm_job_id()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    env |= {"OMP_NUM_THREADS": "1", "SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2",
            "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "0",
            "SLURM_JOB_NODELIST": "127.0.0.[1,5-6]", "CUDA_VISIBLE_DEVICES": ""}
    procs = [subprocess.Popen([sys.executable, str(HERE / "ddp_worker.py"), "--gather-only", "--out-dir", str(tmp_path)],
                              env=env | {"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outs)
    for r in range(2):
        res = json.loads((tmp_path / f"rank{r}_gather.json").read_text())
        assert res["gathered"] == [[0.0] * 3, [1.0] * 3, [1.0] * 3]  # rank 0 gave 1 row, rank 1 two
        rows = {0: [[0, 1, 2]], 1: [[3, 4, 5], [6, 7, 8]]}[r]
        assert res["local_grad"] == [[2.0 * v for v in row] for row in rows]
        assert res["objects"] == [{"rank": 0}, {"rank": 1}] and res["mean"] == 0.5 and res["env_world"] == 2
        assert res["env"] == {"RANK": str(r), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port(str(job), "0"))}


def test_every_command_sees_the_rank_before_it_runs(monkeypatch):
    """The commands' entry wrapper adopts the task's Slurm variables before the command reads RANK (dpr-train
    decides there whether this process writes the run directory; dpr-encode which shards it encodes)."""
    from dpr.cli.common import quiet_interrupt

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(var, "")  # recorded as it was, so what the command sets is undone afterwards
        monkeypatch.delenv(var)
    for key, value in SRUN_TASK.items():
        monkeypatch.setenv(key, value)
    seen = {}

    @quiet_interrupt("dpr-test")
    def main() -> None:
        seen.update(rank=os.environ.get("RANK"), world=os.environ.get("WORLD_SIZE"))

    main()
    assert seen == {"rank": "13", "world": "16"}
    monkeypatch.setenv("SLURM_PROCID", "99")
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(SystemExit) as exit_info:  # a value Slurm never gives: one line, exit 2
        main()
    assert exit_info.value.code == 2


@pytest.mark.parametrize("visible, local_rank, index", [(8, 5, 5), (1, 5, 0), (2, 3, 1)])
def test_a_task_uses_a_gpu_it_sees(visible, local_rank, index, monkeypatch):
    """LOCAL_RANK picks the GPU; a task bound to fewer GPUs than ranks on its node (srun --gpus-per-task=1: one
    GPU, cuda:0) uses those it sees instead of asking for one that does not exist."""
    import torch

    from dpr import distributed as D

    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    assert D.cuda_index() == index


def test_two_srun_tasks_of_dpr_encode_split_the_shards(tiny_model_dir, tiny_data_dir, tmp_path):
    """`srun --ntasks=2 dpr-encode num_shards=2` without torchrun: each task is a rank and encodes its own shard
    (shards i % world_size == rank), and the two shards read together are the one-process encode."""
    from dpr.index.shards import read_embeddings
    from tests.run_command import run_command
    from tests.system.test_submitit import console
    from tests.training.test_trainer import _env

    passages = tiny_data_dir / "tiny" / "passages.tsv"
    args = [f"model={tiny_model_dir}", f"passages={passages}", "dtype=float32", "autocast=off", "threads=1",
            "batch_size=4"]
    common = [*console("dpr-encode"), *args]
    # the reference: the one-process encode, run in this process
    one_process = run_command(["dpr-encode", *args, f"output_dir={tmp_path / 'one'}"], cwd=tmp_path, env=_env())
    assert one_process.returncode == 0, one_process.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env |= {"WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0",
            "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "localhost", "SLURM_NODEID": "0"}
    procs = [subprocess.Popen([*common, f"output_dir={tmp_path / 'srun'}", "num_shards=2"], cwd=tmp_path,
                              env=env | {"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outs)
    for r, out in enumerate(outs):  # each task encoded its own shard and not the other's
        assert f"encode shard {r}/2" in out and f"encode shard {1 - r}/2" not in out, out[-2000:]
    one_ids, one = read_embeddings(tmp_path / "one")
    ids, vectors = read_embeddings(tmp_path / "srun")
    assert ids == one_ids
    np.testing.assert_allclose(vectors, one, rtol=0, atol=1e-5)
