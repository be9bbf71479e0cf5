"""Intra-op threads from this process's share of the cores, and OpenMP threads that yield when they wait.

Measured on the 2-core Zen 4 (a tiny BERT, 12 forwards + backwards per step, other agents' work on the box):
two torch threads with OpenMP's default *active* wait took 0.6-8.7 s per step beside a busy process
(``python -c 'while True: pass'``), against 0.17-0.5 s with ``OMP_WAIT_POLICY=PASSIVE`` (and 0.15-0.29 s
with one thread; a short spin, ``GOMP_SPINCOUNT=10000``, still 2.2 s): waiting threads that spin steal the very
core the other thread needs. So:

- ``import dpr`` (``dpr/__init__.py``) sets ``OMP_WAIT_POLICY=PASSIVE`` unless the user set it: the OpenMP
  runtime reads it once, when torch loads it, so it must be in the environment before ``import torch`` (it
  cannot live here: ``dpr.perf`` imports torch). A program that imported torch before dpr keeps OpenMP's
  default; :func:`configure_threads` says so once.
- `configure_threads` (once per process, at the start of every command: ``dpr.cli.common.report_errors``)
  sets ``torch.set_num_threads`` to the physical cores this process may run on (``os.sched_getaffinity``,
  hyperthread siblings counted once, as torch's own default counts) divided by
  the processes that share them: the ``torchrun`` ranks on this node (``LOCAL_WORLD_SIZE``) times the jobs
  a Hydra sweep runs side by side (its launcher's ``n_jobs``; Hydra's default launcher runs them one after
  another). An explicit ``threads=N`` wins: on every command line (``dpr.cli.argv.hydra_argv`` passes it as
  ``++threads=N``, in no command's config), popped from the config before the command's schema sees it. ``OMP_NUM_THREADS`` is not read: torchrun sets it to 1 for
  every rank whatever the cores.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Mapping

log = logging.getLogger(__name__)

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
THREADS_KEY = "threads"


@dataclass(frozen=True)
class ThreadShare:
    """How many intra-op threads this process takes, and why."""

    threads: int
    cores: int       # cores this process may run on
    sharers: int     # processes on this node that share them (torchrun ranks x parallel sweep jobs)
    source: str      # "threads key" or "share"


def available_cores(sys_cpu: str = "/sys/devices/system/cpu") -> int:
    """Physical cores this process may run on: its CPU affinity (taskset, cgroup cpusets), hyperthread siblings
    counted once (torch's own default is the physical cores; two threads on one core's siblings only contend)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows: no affinity API
        return max(1, os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topo = Path(sys_cpu) / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:  # no sysfs topology (some containers): every logical CPU counts
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))


def _positive_int(value: Any, what: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected a whole number, got {value!r}") from None
    if n < 1:
        raise ValueError(f"{what}: expected a number >= 1, got {n}")
    return n


def sweep_parallel_jobs(launcher: Mapping[str, Any] | None, cores: int) -> int:
    """Jobs a Hydra sweep runs side by side on this machine, from its launcher's config.

    Hydra's default (BasicLauncher) runs one job after another: 1. The joblib launcher runs ``n_jobs`` at a
    time, with joblib's meaning of a negative count (``-1``: as many as cores, ``-2``: one fewer, ...).
    """
    if not launcher:
        return 1
    n_jobs = launcher.get("n_jobs")
    if n_jobs is None:
        return 1
    n = int(n_jobs)
    if n < 0:
        n = cores + 1 + n
    return max(1, n)


def hydra_launcher() -> Mapping[str, Any] | None:
    """The running Hydra job's launcher config (``hydra.launcher``) during a multirun, else None."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        from omegaconf import OmegaConf

        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return None
        return OmegaConf.to_container(hc.launcher, resolve=True)
    except Exception:  # not under Hydra
        return None


def thread_share(explicit: Any = None, env: Mapping[str, str] | None = None,
                 launcher: Mapping[str, Any] | None = None, cores: int | None = None) -> ThreadShare:
    """The rule (module doc): ``explicit`` (the ``threads`` key) if given, else cores // sharers, at least 1."""
    env = os.environ if env is None else env
    cores = available_cores() if cores is None else cores
    ranks = _positive_int(env.get("LOCAL_WORLD_SIZE"), "LOCAL_WORLD_SIZE") or 1
    sharers = ranks * sweep_parallel_jobs(launcher, cores)
    n = _positive_int(explicit, f"config key {THREADS_KEY}")
    if n is not None:
        return ThreadShare(n, cores, sharers, "threads key")
    return ThreadShare(max(1, cores // sharers), cores, sharers, "share")


def pop_threads_key(cfg: Any) -> Any:
    """Remove and return the top-level ``threads`` key of a config (None if absent): a process setting,
    not part of any stage's settings or fingerprints (the command schemas never see it)."""
    if cfg is None:
        return None
    try:
        from omegaconf import DictConfig, open_dict

        if isinstance(cfg, DictConfig):
            if THREADS_KEY not in cfg:
                return None
            with open_dict(cfg):
                return cfg.pop(THREADS_KEY)
    except ImportError:  # pragma: no cover - omegaconf comes with hydra
        pass
    if isinstance(cfg, dict):
        return cfg.pop(THREADS_KEY, None)
    return None


_warned_wait_policy = False


def configure_threads(cfg: Any = None) -> ThreadShare:
    """Set this process's torch intra-op threads by `thread_share` (the ``threads`` key popped from ``cfg``)."""
    global _warned_wait_policy
    import torch

    share = thread_share(pop_threads_key(cfg), launcher=hydra_launcher())
    if torch.get_num_threads() != share.threads:
        torch.set_num_threads(share.threads)
    log.debug("torch threads %d (%s: %d cores, %d sharing)", share.threads, share.source, share.cores, share.sharers)
    too_late = getattr(sys.modules.get("dpr"), "OMP_WAIT_POLICY_TOO_LATE", False)  # set by dpr/__init__.py
    if too_late and not _warned_wait_policy:
        _warned_wait_policy = True  # torch loaded OpenMP before dpr set the policy: say it once
        log.info("%s is not set: OpenMP threads spin while they wait (slow beside other busy processes); "
                 "import dpr before torch or set %s=PASSIVE before starting Python", WAIT_POLICY_ENV, WAIT_POLICY_ENV)
    return share
