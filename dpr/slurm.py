"""An ``srun`` step as a launcher: torchrun's variables from a Slurm task's own.

``srun --ntasks-per-node=8 dpr-train ...`` starts one process per task; Slurm tells each one who it is
(SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE,
SLURM_STEP_NODELIST). :func:`adopt_slurm_env` writes the torchrun names for them (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) so every part of dpr that reads a rank reads it one way.

- torchrun's variables win: a process that has RANK or WORLD_SIZE is left alone (``srun torchrun ...`` runs one
  torchrun agent per node, and the agent gives its workers their ranks).
- Only an ``srun`` task is a rank. A batch script's own shell also has SLURM_PROCID=0 and SLURM_NTASKS=8, but
  it is one process: without srun's SLURM_STEP_NUM_TASKS nothing is set (and a warning says to use srun), so a
  forgotten ``srun`` runs one process instead of waiting forever for seven that never start.
- MASTER_ADDR: the first host of the step's node list (rank 0 runs there under Slurm's default block
  distribution), expanded here from Slurm's compressed form (``gpu[01-03,07]``) without scontrol; scontrol is
  asked only for a form this parser does not know. Else SLURM_LAUNCH_NODE_IPADDR.
- MASTER_PORT: ``20000 + 10 * (job id mod 1000) + (step id mod 10)``: the same in every task of a step without
  talking to each other, different for the next step of the job. An exported MASTER_ADDR / MASTER_PORT is kept.

No torch here: the commands call this before anything heavy is imported.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from itertools import product
from typing import Mapping, MutableMapping

log = logging.getLogger(__name__)

TORCHRUN_VARS = ("RANK", "WORLD_SIZE")
NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
TASKS_PER_NODE_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
PORT_BASE = 20000

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_REPEAT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in {text!r}")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced brackets in {text!r}")
    return parts + [text[start:]]


def _expand_ranges(inner: str) -> list[str]:
    """``01-03,07`` → ``01 02 03 07``: each range keeps the width of its first number (Slurm's padding)."""
    out = []
    for item in inner.split(","):
        m = _RANGE.fullmatch(item)
        if not m:
            raise ValueError(f"bad range {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"bad range {item!r}: {hi} < {lo}")
        out += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
    return out


def _expand_host(pattern: str) -> list[str]:
    """One host pattern: literal text and bracket groups, every group expanded (the leftmost varies slowest)."""
    pieces = re.split(r"(\[[^\[\]]*\])", pattern)
    if any("[" in p or "]" in p for p in pieces if not (p.startswith("[") and p.endswith("]"))):
        raise ValueError(f"bad host pattern {pattern!r}")
    choices = [_expand_ranges(p[1:-1]) if p.startswith("[") else [p] for p in pieces]
    return ["".join(parts) for parts in product(*choices)]


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list (``node[01-03,07],login1``) as host names, in order. ValueError for a form
    this parser does not read (:func:`first_host` then asks scontrol)."""
    text = text.strip()
    if not text or text == "(null)":
        raise ValueError("empty node list")
    hosts = []
    for part in _split_top(text):
        if not part:
            raise ValueError(f"empty host in {text!r}")
        hosts += _expand_host(part)
    return hosts


def tasks_per_node(text: str) -> list[int]:
    """Slurm's task counts per node (``2(x3),1`` → ``[2, 2, 2, 1]``)."""
    out = []
    for item in text.strip().split(","):
        m = _REPEAT.fullmatch(item.strip())
        if not m:
            raise ValueError(f"bad tasks-per-node entry {item!r} in {text!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def first_host(nodelist: str) -> str:
    """The first host of a node list: parsed here, else ``scontrol show hostnames`` when Slurm's tools are on
    PATH (a form this parser does not read)."""
    try:
        return expand_nodelist(nodelist)[0]
    except ValueError:
        scontrol = shutil.which("scontrol")
        if scontrol is None:
            raise
        out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, check=True,
                             timeout=30)
        return out.stdout.split()[0]


def master_port(job_id: str | None, step_id: str | None) -> int:
    """The rendezvous port every task of one step derives alike (module doc)."""
    job = int(job_id) if job_id and job_id.isdigit() else 0
    step = int(step_id) if step_id and step_id.isdigit() else 0
    return PORT_BASE + 10 * (job % 1000) + step % 10


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"{name}={env[name]!r}: not an integer") from None


def _master_addr(env: Mapping[str, str]) -> str:
    for name in NODELIST_VARS:
        if env.get(name, "").strip() not in ("", "(null)"):
            try:
                return first_host(env[name])
            except (ValueError, OSError, subprocess.SubprocessError) as err:
                raise ValueError(f"{name}={env[name]!r}: {err}") from None
    if env.get("SLURM_LAUNCH_NODE_IPADDR"):
        return env["SLURM_LAUNCH_NODE_IPADDR"]
    raise ValueError("an srun task without SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or SLURM_LAUNCH_NODE_IPADDR: "
                     "export MASTER_ADDR")


def _local_world(env: Mapping[str, str]) -> int | None:
    node = _int(env, "SLURM_NODEID") if env.get("SLURM_NODEID") else 0
    for name in TASKS_PER_NODE_VARS:
        if env.get(name):
            try:
                counts = tasks_per_node(env[name])
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from None
            return counts[node] if node < len(counts) else None
    return None


def torchrun_env_from_slurm(env: Mapping[str, str]) -> dict[str, str]:
    """torchrun's variables for an ``srun`` task of a step of more than one task; ``{}`` elsewhere (no Slurm,
    one task, a batch script's shell). ValueError naming the variable for a value that is not Slurm's."""
    if "SLURM_PROCID" not in env:
        return {}
    if "SLURM_STEP_NUM_TASKS" not in env:
        if env.get("SLURM_NTASKS", "1").isdigit() and int(env.get("SLURM_NTASKS", "1")) > 1:
            log.warning("SLURM_NTASKS=%s but this process is not an srun task: running as one process (launch "
                        "with srun for one rank per task)", env["SLURM_NTASKS"])
        return {}
    world, rank = _int(env, "SLURM_STEP_NUM_TASKS"), _int(env, "SLURM_PROCID")
    if world <= 1:
        return {}
    if not 0 <= rank < world:
        raise ValueError(f"SLURM_PROCID={rank} outside 0..{world - 1} (SLURM_STEP_NUM_TASKS={world})")
    local = _int(env, "SLURM_LOCALID") if env.get("SLURM_LOCALID") else 0
    out = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local), "MASTER_ADDR": _master_addr(env),
           "MASTER_PORT": str(master_port(env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")))}
    local_world = _local_world(env)
    if local_world:
        out["LOCAL_WORLD_SIZE"] = str(local_world)
    return out


def adopt_slurm_env(env: MutableMapping[str, str] | None = None) -> bool:
    """Inside an ``srun`` task and without torchrun's variables, set torchrun's from the task's Slurm ones (a
    MASTER_ADDR or MASTER_PORT already exported is kept). True when it set them; a second call changes
    nothing. Every command calls it before it reads a rank, and so does `dpr.distributed.init_distributed`."""
    env = os.environ if env is None else env
    if any(v in env for v in TORCHRUN_VARS):
        return False
    mapped = torchrun_env_from_slurm(env)
    for key, value in mapped.items():
        env.setdefault(key, value)
    if mapped:
        log.info("slurm task %s of %s: rank %s/%s (local %s), master %s:%s", env["SLURM_PROCID"], mapped["WORLD_SIZE"],
                 env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"])
    return bool(mapped)
