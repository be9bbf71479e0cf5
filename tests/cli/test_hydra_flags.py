"""Hydra's own flags (--cfg job, --info, --help, -m) work with overrides, in any order, on every command.

Each console script's entry point runs in-process (tests/run_command.py: ``sys.argv`` set, ``SystemExit`` caught,
output captured), ``--help`` as a real process; ``--cfg`` / ``--info`` / ``--help`` print and do no work.
Before dpr/cli/argv.py, ``dpr-train loss=hinge --cfg job`` failed with "unrecognized arguments:
hydra.output_subdir=.hydra.pending" (the command appended its own override after Hydra's flags), and an
override after a flag failed on every command (argparse reads the overrides as one positional run).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpr.cli.argv import hydra_argv, shows_only, split_argv
from tests.run_command import BIN, run_command


def _run(command: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    if "--help" in args:
        # a real process: Hydra's --help lists every config group the process has registered (a worker that ran
        # other commands holds theirs too), deep-copying the whole store once per group; --help imports no torch
        env = dict(os.environ, WANDB_MODE="disabled")
        env.pop("RANK", None)
        return subprocess.run([str(BIN / command), *args], env=env, capture_output=True, text=True, timeout=120,
                              cwd=cwd)
    return run_command([command, *args], cwd=cwd)  # the console script's main, in-process


# (command, first override, second override, what each must print in the job config)
COMMANDS = [
    ("dpr-data", "data_dir=/x/prepared", "force=true", "data_dir: /x/prepared", "force: true"),
    ("dpr-bm25", "k=7", "split=dev", "k: 7", "split: dev"),
    ("dpr-encode", "model=/x/model", "batch_size=7", "model_path: /x/model", "batch_size: 7"),
    ("dpr-index", "embeddings=/x/emb", "output=/x/index", "embeddings: /x/emb", "output: /x/index"),
    ("dpr-retrieve", "model=/x/model", "index=/x/index", "model_path: /x/model", "index_path: /x/index"),
    ("dpr-eval", "results=/x/r.json", "resamples=7", "results: /x/r.json", "resamples: 7"),
    ("dpr-export", "model=/x/model", "output=/x/out", "model_path: /x/model", "output: /x/out"),
    ("dpr-pipeline", "data_dir=/x/prepared", "seed=7", "data_dir: /x/prepared", "seed: 7"),
    ("dpr-train", "loss=hinge", "seed=7", "HingeLoss", "seed: 7"),
    ("dpr-rerank train", "output_dir=/x/ce", "rerank.train.seed=7", "output_dir: /x/ce", "seed: 7"),
    ("dpr-rerank score", "model=/x/ce", "output=/x/o.json", "model_path: /x/ce", "output: /x/o.json"),
    ("dpr-data export", "data=sq", "output=/x/o.jsonl", "dataset: sq", "output: /x/o.jsonl"),
    ("dpr-data inspect", "data=sq", "output=/x/insp", "dataset: sq", "output: /x/insp"),
]


@pytest.mark.parametrize("command,a,b,shows_a,shows_b", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_cfg_job_between_overrides_on_every_command(command, a, b, shows_a, shows_b, tmp_path):
    proc = _run(*command.split(), a, "--cfg", "job", b, cwd=tmp_path)  # a subcommand stays first
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shows_a in proc.stdout and shows_b in proc.stdout
    assert not any(tmp_path.iterdir())  # printing the config writes nothing (no run dir, no .hydra/)


def test_reader_takes_its_subcommand_anywhere(tmp_path):
    proc = _run("dpr-reader", "--cfg", "job", "train", "output_dir=/x/reader", cwd=tmp_path)
    assert proc.returncode == 0 and "output_dir: /x/reader" in proc.stdout, proc.stderr[-2000:]
    proc = _run("dpr-reader", "model=/x/r", "eval", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 0 and "reader_model: /x/r" in proc.stdout, proc.stderr[-2000:]
    proc = _run("dpr-reader", "--help")
    assert proc.returncode == 0 and "usage: dpr-reader" in proc.stdout


@pytest.mark.parametrize("args,expect", [
    (["loss=hinge", "--cfg", "job"], "HingeLoss"),                       # the probe's command
    (["data=squad1_open", "--cfg", "job"], "name: squad1_open"),
    (["--cfg", "job", "train.lr=3e-05", "seed=9"], "lr: 3.0e-05"),
    (["seed=9", "--info", "defaults"], "Defaults List"),
    (["seed=9", "--info"], "Defaults Tree"),                            # --info without its optional value
    (["--info", "defaults", "loss=hinge"], "loss/hinge"),
    (["train.lr=3e-05", "--help"], "lr: 3.0e-05"),
    (["--help", "loss=hinge"], "HingeLoss"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_train_flags_with_overrides_in_any_order(args, expect, tmp_path):
    proc = _run("dpr-train", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert expect in proc.stdout and "unrecognized arguments" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_train_multirun_flag_after_overrides(tmp_path):
    # -m after the overrides: each job starts and reaches the command's own checks (here: nothing to train); the
    # refused sweep leaves no directory
    out = tmp_path / "sweep"
    proc = _run("dpr-train", "train.max_steps=0,1", "train.epochs=0", "-m", f"output_dir={out}",
                f"data_dir={tmp_path / 'none'}", cwd=tmp_path)
    assert "unrecognized arguments" not in proc.stderr
    assert "zero training steps" in proc.stderr and not out.exists(), proc.stderr[-2000:]


# ---------------------------------------------------------------- the argv splitter

_override = st.from_regex(r"[+~]?[a-z][a-z_.]{0,8}=[a-z0-9,./]{0,6}", fullmatch=True)
_flag = st.sampled_from([["--cfg", "job"], ["-c", "all"], ["--info"], ["--info", "defaults"], ["-m"], ["--multirun"],
                         ["--help"], ["--resolve"], ["--config-dir", "/x/conf"], ["-cd", "/x"], ["--package", "p"],
                         ["--cfg=hydra"], ["--config-name", "train"]])


@given(st.lists(st.one_of(_override.map(lambda o: [o]), _flag), max_size=8))
def test_split_keeps_overrides_in_order_and_flags_with_their_values(parts):
    args = [a for p in parts for a in p]
    overrides, flags = split_argv(args)
    assert overrides == [p[0] for p in parts if not p[0].startswith("-")]
    assert flags == [a for p in parts if p[0].startswith("-") for a in p]
    rebuilt = hydra_argv(["prog", *args], extra={"hydra.output_subdir": ".hydra.pending"})
    assert rebuilt == ["prog", *overrides, *(["hydra.output_subdir=.hydra.pending"]), *flags]
    assert shows_only(["prog", *args]) == any(p[0].partition("=")[0] in ("--cfg", "-c", "--info", "--help")
                                              for p in parts)


def test_extra_overrides_yield_to_the_users():
    argv = ["prog", "--cfg", "job", "+hydra.output_subdir=mine", "a=1"]
    assert hydra_argv(argv, extra={"hydra.output_subdir": "x", "b": "2"}) == [
        "prog", "+hydra.output_subdir=mine", "a=1", "b=2", "--cfg", "job"]
    assert hydra_argv(["prog", "model=/m", "-m"], renames={"model": "model_path"}) == ["prog", "model_path=/m", "-m"]
