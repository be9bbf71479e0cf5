"""Relative paths mean "relative to where the user ran the command", everywhere; CI cannot pass vacuously."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, write_tiny_dataset
from tests.run_command import run_command


def test_relative_data_dir_and_output_survive_hydra_chdir(tmp_path):
    """``hydra.job.chdir=true`` moves the process into its run dir; relative ``data_dir``/``output`` still
    mean the launch directory (before: "no prepared dataset at data/tiny")."""
    write_tiny_dataset(tmp_path / "data" / "tiny")
    proc = run_command(
        ["dpr-bm25", "data=squad1_open", "data.name=tiny", "data.kind=qa", "data_dir=data",
         "split=test", "output=out/bm25.json", "hydra.job.chdir=true", "hydra.run.dir=elsewhere"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "out" / "bm25.json").is_file()


def test_relative_mirror_env_resolved_against_launch_dir(mirror_dir, tmp_path):
    """A relative ``DPR_DATA_MIRROR`` is read from where the command was run, even after Hydra changes
    directory (before: "../shared/data/... not found in the data mirror")."""
    launch = tmp_path / "launch"
    launch.mkdir()
    rel = os.path.relpath(mirror_dir, launch)
    proc = run_command(  # the mirror variable is read when the command runs, so in-process holds as a process
        ["dpr-data", "data=nq_open_dev", "data_dir=prep", "hydra.job.chdir=true", "hydra.run.dir=elsewhere"],
        cwd=launch, env={"DPR_DATA_MIRROR": rel})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (launch / "prep" / "nq_open_dev" / "test.qa.tsv").is_file()


def test_conftest_exports_the_mirror_absolute():
    """Tests hand the mirror to subprocesses in other directories: it must be absolute by then."""
    if os.environ.get("DPR_DATA_MIRROR"):
        assert Path(os.environ["DPR_DATA_MIRROR"]).is_absolute()


def _mini_suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(REPO / "tests" / "conftest.py", suite / "conftest.py")
    (suite / "test_lib.py").write_text(
        "import pytest\nlib = pytest.importorskip('no_such_library_dpr_test')\n\n\ndef test_x():\n    pass\n")
    (suite / "test_ok.py").write_text("def test_ok():\n    pass\n")
    return suite


def test_missing_cross_check_library_fails_under_ci(tmp_path):
    """Under CI=true an ``importorskip`` (pytrec_eval's cross-check) is a failure, not a green skip."""
    suite = _mini_suite(tmp_path)
    # PYTHONPATH: the copied conftest loads the repository's tests.durations plugin
    base = {**{k: v for k, v in os.environ.items() if k != "CI"}, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)]
    relaxed = subprocess.run(cmd, cwd=suite, capture_output=True, text=True, env=base, timeout=120)
    strict = subprocess.run(cmd, cwd=suite, capture_output=True, text=True, env={**base, "CI": "true"}, timeout=120)
    assert relaxed.returncode == 0, relaxed.stdout[-2000:]
    assert strict.returncode != 0, strict.stdout[-2000:]


def test_ci_script_runs_the_readme_command_with_ci_true():
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    command = "DPR_DATA_MIRROR=../shared/data .venv/bin/python -m pytest -q -n 2 --dist loadfile tests"
    assert command in readme
    assert any(line.strip() == command for line in ci.splitlines())
    assert "export CI=true" in ci


def test_ci_script_runs_the_precision_tests_under_the_other_rule():
    """After the README's command, .ci/run reruns ``-m precision`` under the rule this CPU's ``auto`` does not
    follow; the rule it picks is the opposite of what ``auto`` means here, under either switch."""
    ci = (REPO / ".ci" / "run").read_text()
    assert '-m precision tests' in ci and 'env "$other_rule=1"' in ci
    pick = next(line for line in ci.splitlines() if line.startswith("other_rule="))
    code = pick.split('-c "', 1)[1].rsplit('"', 1)[0]
    for switch, other in (("DPR_NO_BF16", "DPR_FORCE_BF16"), ("DPR_FORCE_BF16", "DPR_NO_BF16")):
        env = {k: v for k, v in os.environ.items() if k not in ("DPR_NO_BF16", "DPR_FORCE_BF16")}
        out = subprocess.run([sys.executable, "-c", code], env={**env, switch: "1"}, capture_output=True,
                             text=True, timeout=120, check=True).stdout.strip()
        assert out == other
