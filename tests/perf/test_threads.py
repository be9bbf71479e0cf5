"""Each process takes its share of the cores: torchrun ranks, a Hydra sweep's parallel jobs, the threads key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dpr.perf.threads import ThreadShare, configure_threads, sweep_parallel_jobs, thread_share

ROOT = Path(__file__).resolve().parents[2]
JOBLIB = {"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher", "n_jobs": 2}
BASIC = {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}


@pytest.mark.parametrize("cores, env, launcher, explicit, want", [
    (16, {}, None, None, 16),                                    # alone: every core
    (16, {"LOCAL_WORLD_SIZE": "2"}, None, None, 8),               # torchrun, 2 ranks
    (2, {"LOCAL_WORLD_SIZE": "4"}, None, None, 1),                # more ranks than cores: at least 1
    (16, {}, JOBLIB, None, 8),                                    # a sweep running 2 jobs side by side
    (16, {"LOCAL_WORLD_SIZE": "2"}, JOBLIB, None, 4),             # both
    (16, {}, BASIC, None, 16),                                    # Hydra's default launcher: one job at a time
    (16, {}, {**JOBLIB, "n_jobs": -1}, None, 1),                  # joblib's -1: as many jobs as cores
    (16, {}, {**JOBLIB, "n_jobs": -5}, None, 1),                  # -5: 12 jobs
    (16, {"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}, None, None, 8),  # torchrun's OMP_NUM_THREADS=1 ignored
    (16, {"LOCAL_WORLD_SIZE": "2"}, JOBLIB, 3, 3),                # the explicit key wins
])
def test_share_rule(cores, env, launcher, explicit, want):
    share = thread_share(explicit, env=env, launcher=launcher, cores=cores)
    assert share.threads == want
    assert share.source == ("threads key" if explicit else "share")


def test_threads_key_on_every_command_line():
    from dpr.cli.argv import hydra_argv

    assert hydra_argv(["dpr-x", "threads=2", "k=3", "-m"]) == ["dpr-x", "++threads=2", "k=3", "-m"]


def test_hyperthread_siblings_count_once(tmp_path, monkeypatch):
    from dpr.perf.threads import available_cores

    for cpu, core in enumerate([0, 1, 0, 1]):  # 4 logical CPUs, 2 cores (siblings 0/2 and 1/3)
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "core_id").write_text(f"{core}\n")
        (topo / "physical_package_id").write_text("0\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert available_cores(str(tmp_path)) == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2})  # taskset to one core's two siblings
    assert available_cores(str(tmp_path)) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 7})  # cpu7: no topology files
    assert available_cores(str(tmp_path)) == 3


def test_joblib_negative_counts():
    assert sweep_parallel_jobs({"n_jobs": -1}, 8) == 8
    assert sweep_parallel_jobs({"n_jobs": -2}, 8) == 7
    assert sweep_parallel_jobs({"n_jobs": 3}, 8) == 3
    assert sweep_parallel_jobs({}, 8) == 1


@pytest.mark.parametrize("bad", [0, -2, "many"])
def test_bad_threads_key_is_one_line(bad):
    with pytest.raises(ValueError, match="config key threads"):
        thread_share(bad, env={}, cores=4)


def test_configure_pops_the_key_and_sets_torch():
    import torch

    before = torch.get_num_threads()
    cfg = OmegaConf.create({"threads": 1, "k": 5})
    OmegaConf.set_struct(cfg, True)
    try:
        share = configure_threads(cfg)
        assert share == ThreadShare(1, share.cores, share.sharers, "threads key")
        assert torch.get_num_threads() == 1
        assert "threads" not in cfg and cfg.k == 5  # the schemas and fingerprints never see it
    finally:
        torch.set_num_threads(before)


_CHILD = """
import json, os, sys
import dpr
from dpr.perf.threads import configure_threads
import torch
share = configure_threads(None)
print(json.dumps({"torch": torch.get_num_threads(), "share": share.threads, "wait": os.environ.get("OMP_WAIT_POLICY")}))
"""


def _child(env: dict[str, str]) -> dict:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    full.pop("OMP_WAIT_POLICY", None)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=full, capture_output=True, text=True, timeout=120,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_processes_take_their_share():
    """Real processes, as torchrun starts them: the ranks of one node split this process's cores."""
    from dpr.perf.threads import available_cores

    cores = available_cores()
    alone = _child({})
    assert alone["torch"] == cores
    assert alone["wait"] == "PASSIVE"  # set by `import dpr`, before torch loaded OpenMP
    ranks = _child({"LOCAL_WORLD_SIZE": str(cores), "OMP_NUM_THREADS": "1"})
    assert ranks["torch"] == 1
    if cores >= 2:
        half = _child({"LOCAL_WORLD_SIZE": "2"})
        assert half["torch"] == cores // 2


_LAUNCHER = """
from hydra._internal.core_plugins.basic_launcher import BasicLauncher


class SideBySideLauncher(BasicLauncher):
    \"\"\"Declares n_jobs as hydra-joblib-launcher does (jobs run side by side); runs them in turn here.\"\"\"

    def __init__(self, n_jobs: int = 1) -> None:
        super().__init__()
        self.n_jobs = n_jobs
"""


def test_sweep_jobs_under_hydra(tmp_path):
    """A real Hydra multirun whose launcher declares n_jobs=2 (the joblib launcher's key): each job takes half
    the cores. The joblib launcher is not installed here: a launcher plugin with its config shape stands in."""
    plugin = tmp_path / "plugins" / "hydra_plugins" / "side_by_side"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text(_LAUNCHER)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "c.yaml").write_text("x: 0\n")  # threads: in no config (hydra_argv adds it)
    app = tmp_path / "app.py"
    app.write_text(f"""
import json, sys, hydra, torch
from dpr.cli.argv import hydra_argv
from dpr.cli.common import report_errors

@hydra.main(version_base="1.3", config_path="conf", config_name="c")
@report_errors("app")
def main(cfg):
    print("JOB", json.dumps({{"x": cfg.x, "torch": torch.get_num_threads(), "has_key": "threads" in cfg}}))

sys.argv = hydra_argv(sys.argv)  # as every dpr command does
main()
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path / "plugins")])}
    out = subprocess.run([sys.executable, str(app), "-m", "x=1,2",
                          "hydra.launcher._target_=hydra_plugins.side_by_side.SideBySideLauncher",
                          "+hydra.launcher.n_jobs=2",
                          f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    jobs = [json.loads(line[4:]) for line in out.stdout.splitlines() if line.startswith("JOB ")]
    from dpr.perf.threads import available_cores

    cores = available_cores()
    assert [j["x"] for j in jobs] == [1, 2]
    assert all(j["torch"] == max(1, cores // 2) and not j["has_key"] for j in jobs)
    out = subprocess.run([sys.executable, str(app), "x=3", "threads=1", f"hydra.run.dir={tmp_path / 'run'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.split("JOB ", 1)[1])["torch"] == 1
