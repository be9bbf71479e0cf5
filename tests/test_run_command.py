"""tests/run_command.py runs a console script in-process as its process would run: the same exit status and output
as the installed script for a config error, a Hydra flag and a missing model; and nothing of the command's stays
behind in the test process (Hydra's singletons, logging, the environment, the directory, torch's global state)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from tests.run_command import BIN, run_command

CASES = [
    ["dpr-retrieve", "k=abc", "output=o.json"],                         # a value of the wrong type: one line, exit 2
    ["dpr-bm25", "+topk=5"],                                            # an unknown key
    ["dpr-train", "loss=hinge", "--cfg", "job", "seed=7"],              # a Hydra flag between overrides
    ["dpr-encode", "model=/nonexistent/m", "passages=p.tsv", "output_dir=e"],  # a missing model directory
    ["dpr-reader", "--help"],                                           # a subcommand's own argparse
]


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(c[:2]) for c in CASES])
def test_in_process_equals_the_installed_script(argv, tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop("RANK", None)
    proc = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    inner = run_command(argv, cwd=tmp_path)
    assert (inner.returncode, inner.stdout, inner.stderr) == (proc.returncode, proc.stdout, proc.stderr)
    assert not any(tmp_path.iterdir())


def _state() -> dict:
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    root = logging.getLogger()
    return {"cwd": os.getcwd(), "env": dict(os.environ), "argv": list(sys.argv),
            "hydra": GlobalHydra.instance().is_initialized(), "hydra_config": HydraConfig.initialized(),
            "root": (root.level, list(root.handlers)),
            "dpr": (logging.getLogger("dpr").level, list(logging.getLogger("dpr").handlers)),
            "torch": (torch.is_grad_enabled(), torch.get_default_dtype(), torch.get_num_threads()),
            "rng": torch.get_rng_state()}


def test_a_real_run_leaves_the_process_as_it_found_it(tmp_path, tiny_data_dir):
    """A command that runs (Hydra changes into its run directory, configures logging, opens a log file, sets
    HYDRA_FULL_ERROR) and one that fails: afterwards, the test process is as before."""
    before = _state()
    tiny = tiny_data_dir / "tiny"
    for _ in range(2):  # twice: a second @hydra.main in one process starts as the first did
        proc = run_command(["dpr-bm25", f"passages={tiny / 'passages.tsv'}", f"qa={tiny / 'test.qa.tsv'}",
                            "output=out.json", "k=2", "hydra.job.chdir=true"], cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (tmp_path / "out.json").is_file()
        after = _state()
        rng = after.pop("rng"), before["rng"]
        assert after == {k: v for k, v in before.items() if k != "rng"} and torch.equal(*rng)
    assert run_command(["dpr-index"], cwd=tmp_path).returncode == 2  # a refusal: exit 2 out of Hydra's run
    after = _state()
    assert torch.equal(after.pop("rng"), before["rng"]) and after == {k: v for k, v in before.items() if k != "rng"}


def test_an_uncaught_exception_is_a_traceback_and_exit_1(monkeypatch):
    import dpr.cli.eval as command

    def boom():
        raise RuntimeError("boom")

    monkeypatch.setattr(command, "main", boom)
    from tests import run_command as rc

    rc._entry_point.cache_clear()
    try:
        proc = run_command(["dpr-eval"])
    finally:
        rc._entry_point.cache_clear()
    assert proc.returncode == 1 and "Traceback" in proc.stderr and proc.stderr.strip().endswith("RuntimeError: boom")
