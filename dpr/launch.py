"""One command on every GPU of the machine: a command that is not yet a rank relaunches itself under torchrun.

``dpr-pipeline ...`` on a machine with 8 GPUs runs as ``python -m torch.distributed.run --standalone
--nproc_per_node=8 -m dpr.cli.pipeline ...`` (the same arguments): the ``nproc_per_node`` key (`LaunchConfig`)
says how many processes, ``auto`` one per visible GPU. The decision (`processes_to_launch`):

- a process that already is a rank runs as it is: torchrun's variables are set (an explicit ``torchrun``, or the
  relaunched processes themselves), or it is an ``srun`` task (Slurm starts the ranks, `dpr.slurm`): a relaunch
  there would start ranks inside ranks;
- otherwise ``auto`` is ``torch.cuda.device_count()`` when above 1, else 1 (the CPU, one GPU); an integer is that
  many processes (2 on the CPU runs two gloo ranks); 1 runs here.

`relaunch` starts torchrun in a process group of its own and forwards the signals this process receives
(SIGINT, SIGTERM, SIGHUP, SIGQUIT) to it, once each: a Ctrl-C reaches torchrun through this process only, and
torchrun stops its workers. It returns torchrun's exit status (128 + N when killed by signal N). The caller
relaunches before it takes any lock of the run directory (`dpr.run_dir`): the relaunched rank 0 takes it.

Registered as ``launch_cfg/default`` (conf/pipeline.yaml places it at the root: ``nproc_per_node=2``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from dpr.config import ranged, register_defaults

log = logging.getLogger(__name__)

AUTO = "auto"
MAX_NPROC = 1024
# torchrun's variables of a rank (RANK, WORLD_SIZE: what `dpr.slurm.adopt_slurm_env` writes for an srun task too)
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
FORWARDED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name))


@dataclass
class LaunchConfig:
    # processes on this machine: auto = one per visible GPU (one on the CPU or a single GPU); N > 1 relaunches
    # the command under torchrun --standalone with N ranks (gloo on the CPU); a process that already is a rank
    # (torchrun, an srun task) runs as it is
    nproc_per_node: int | str = ranged(AUTO, 1, MAX_NPROC, note="or auto")

    def check(self) -> "LaunchConfig":
        """``auto`` or an integer in [1, MAX_NPROC] (one line naming the key otherwise); returns self."""
        value = self.nproc_per_node
        if value == AUTO:
            return self
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NPROC:
            raise ValueError(f"nproc_per_node must be auto or an integer in [1, {MAX_NPROC}], got {value!r}")
        return self


def rank_context(env: Mapping[str, str]) -> str | None:
    """Why this process already is a rank (it must not relaunch), or None: torchrun's variables, an srun task."""
    found = [name for name in RANK_VARS if name in env]
    if found:
        return f"already a rank ({', '.join(f'{n}={env[n]}' for n in found)})"
    if "SLURM_STEP_NUM_TASKS" in env:  # srun's own variable: a batch script's shell does not have it
        return f"an srun task (SLURM_STEP_NUM_TASKS={env['SLURM_STEP_NUM_TASKS']}): srun starts the ranks"
    return None


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def processes_to_launch(value: Any, env: Mapping[str, str] | None = None,
                        gpu_count: Callable[[], int] = _cuda_count) -> tuple[int, str]:
    """``(N, why)``: the processes to relaunch with for ``nproc_per_node=value`` (1: run in this process)."""
    value = LaunchConfig(value).check().nproc_per_node
    env = os.environ if env is None else env
    context = rank_context(env)
    if context is not None:
        if value != AUTO and value > 1 and str(value) != env.get("WORLD_SIZE"):
            log.warning("nproc_per_node=%s not applied: this process is %s", value, context)
        return 1, context
    if value != AUTO:
        return value, f"nproc_per_node={value}"
    gpus = gpu_count()
    return (gpus, f"nproc_per_node=auto: {gpus} GPUs visible") if gpus > 1 else \
        (1, f"nproc_per_node=auto: {gpus} GPU{'s' if gpus != 1 else ''} visible")


def torchrun_command(nproc: int, module: str, argv: Sequence[str]) -> list[str]:
    """The command line that runs ``python -m <module> <argv>`` as ``nproc`` ranks of a one-machine torchrun."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", module, *argv]


def exit_status(returncode: int) -> int:
    """A child's ``returncode`` as a shell reports it: killed by signal N (negative) → 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _dies_with(parent: int) -> Callable[[], None] | None:
    """For the child, before it runs (Linux): SIGTERM when ``parent`` dies, even of a SIGKILL that no handler can pass
    on, so torchrun stops its ranks instead of running on without the command that started it. None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None

    def arm() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # no prctl: the signals a handler can pass on still are
            return
        if os.getppid() != parent:  # the parent died before the line above: nobody will send it
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def run_forwarding_signals(cmd: Sequence[str], cwd: str | os.PathLike | None = None) -> int:
    """Run ``cmd`` in a process group of its own, passing on each signal of FORWARDED this process receives, and
    return its exit status (`exit_status`); on Linux it is also sent SIGTERM if this process dies (`_dies_with`).
    The handlers are this process's again afterwards."""
    received: list[int] = []
    started: list[subprocess.Popen] = []

    def forward(signum: int, _frame: Any) -> None:  # no logging here: a handler may interrupt a log call
        received.append(signum)
        for child in started:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():  # Python handles signals in the main thread only
        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        proc = subprocess.Popen(list(cmd), cwd=cwd, process_group=0, preexec_fn=_dies_with(os.getpid()))
        early = list(received)  # arrived while it started: passed on now
        started.append(proc)
        for signum in early:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)
        status = exit_status(proc.wait())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        log.info("signals %s passed on to pid %d, which exited with status %d",
                 ", ".join(signal.Signals(s).name for s in received), proc.pid, status)
    return status


def relaunch(nproc: int, module: str, argv: Sequence[str], why: str, cwd: str | os.PathLike | None = None) -> int:
    """Run ``module`` with ``argv`` as ``nproc`` torchrun ranks (`torchrun_command`), saying so in one line;
    torchrun's exit status."""
    cmd = torchrun_command(nproc, module, argv)
    log.info("%s: launching %d processes on this machine: %s", why, nproc, shlex.join(cmd))
    return run_forwarding_signals(cmd, cwd=cwd)


def register_schema() -> None:
    """``launch_cfg/default``: LaunchConfig's defaults, for conf/pipeline.yaml's root."""
    register_defaults("launch_cfg", "default", LaunchConfig)
