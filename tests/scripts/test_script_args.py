"""scripts/ keep the commands' rules on their command line (scripts/script_args.py): each bad argument is one line,
exit 2, before any work; an output never replaces a directory or a user's file of another kind. Here: the shared
argparse types (hypothesis), bench_overhead.py's arguments, gpu_check.sh's OUT and --bundle."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import REPO
from tests.scripts import script

args_mod = script("script_args")


def one_line_exit_2(call, capsys, words: str) -> str:
    with pytest.raises(SystemExit) as info:
        call()
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2, err
    assert len(err.splitlines()) == 1 and words in err, err
    return err


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12), st.integers(-3, 3), st.integers(3, 9))
def test_whole_accepts_exactly_the_whole_numbers_in_range(text, lo, hi):
    parse = args_mod.whole(lo, hi)
    try:
        expected = int(text)
    except ValueError:
        expected = None
    if expected is not None and lo <= expected <= hi:
        assert parse(text) == expected
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=f"in \\[{lo}, {hi}\\]"):
            parse(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=20))
def test_key_value_needs_a_key_and_an_equals_sign(text):
    key, eq, _ = text.partition("=")
    ok = bool(eq) and bool(key.strip()) and all(p.isidentifier() for p in key.strip().split("."))
    try:
        k, _ = args_mod.key_value(text)
    except argparse.ArgumentTypeError as err:
        assert "\n" not in str(err)
        if ok:  # refused only for the value: YAML that does not parse
            assert "is not YAML" in str(err)
    else:
        assert ok and k == key.strip()


def test_outputs_refuse_directories_and_other_kinds_of_file(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError, match="is a directory"):
        args_mod.output_file(str(tmp_path))
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")
    with pytest.raises(argparse.ArgumentTypeError, match="exists and is not JSON; it is not replaced"):
        args_mod.json_output(str(tmp_path / "notes.csv"))
    with pytest.raises(argparse.ArgumentTypeError, match="is a file, not a directory"):
        args_mod.output_file(str(tmp_path / "notes.csv" / "out.json"))
    (tmp_path / "old.json").write_text('{"rows": []}')
    (tmp_path / "empty.json").write_text("")
    for ok in ("old.json", "empty.json", "new/dir/out.json"):
        assert args_mod.json_output(str(tmp_path / ok)) == tmp_path / ok
    with pytest.raises(argparse.ArgumentTypeError, match="no such file"):
        args_mod.input_file(str(tmp_path / "absent"))
    with pytest.raises(argparse.ArgumentTypeError, match="is a directory, not a file"):
        args_mod.input_file(str(tmp_path))


def test_one_line_parser(capsys):
    ap = args_mod.OneLineParser(prog="x")
    ap.add_argument("--n", type=args_mod.whole(1))
    err = one_line_exit_2(lambda: ap.parse_args(["--n", "0"]), capsys, "x: argument --n: expected a whole number >= 1")
    assert "usage: " not in err


@pytest.mark.parametrize("argv, words", [
    (["--steps", "2", "--skip", "3"], "--skip 3 leaves no timed step of --steps 2"),
    (["--steps", "2", "--skip", "2"], "--skip 2 leaves no timed step of --steps 2"),
    (["--set", "background_loader"], "argument --set: expected KEY=VALUE"),
    (["--set", "no_such_key=1"], "--set: unknown train config keys ['no_such_key']"),
    (["--set", "lr=-1"], "--set: train.lr must be"),
    (["--repeat", "0"], "argument --repeat: expected a whole number >= 1, got '0'"),
    (["--batch-size", "0"], "argument --batch-size: expected a whole number >= 1"),
    (["--steps", "x"], "argument --steps: expected a whole number >= 1"),
    (["--passages", "-5"], "argument --passages: expected a whole number >= 1"),
    (["--json", "{tmp}"], "argument --json: {tmp}: is a directory"),
    (["--json", "{tmp}/notes.txt"], "argument --json: {tmp}/notes.txt: exists and is not JSON"),
    (["--data-dir", "{tmp}", "--data", "no_such_recipe"], "--data no_such_recipe: data config: field 'recipe'"),
])
def test_bench_overhead_bad_arguments_are_one_line(tmp_path, capsys, argv, words):
    (tmp_path / "notes.txt").write_text("mine")
    argv = [a.format(tmp=tmp_path) for a in argv]
    one_line_exit_2(lambda: script("bench_overhead").main(argv), capsys, words.format(tmp=tmp_path))
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def _gpu_check(tmp_path, *args, out):
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), *args], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "PY": sys.executable, "OUT": str(out)})


@pytest.mark.parametrize("case", ["out_file", "out_user_dir", "bundle_missing", "out_under_file"])
def test_gpu_check_bad_out_or_bundle_is_one_line(tmp_path, case):
    """OUT a file, OUT a directory of the user's files, OUT under a file, --bundle missing: one line, exit 2,
    nothing written."""
    (tmp_path / "f").write_text("mine")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "facts.json").write_text('{"mine": 1}')
    out, args, words = {
        "out_file": (tmp_path / "f", ["--cpu"], "is a file, not a directory"),
        "out_user_dir": (tmp_path / "mine", ["--cpu"], "holds files an earlier check did not write"),
        "bundle_missing": (tmp_path / "new", ["--bundle", str(tmp_path / "absent")], "no such directory"),
        "out_under_file": (tmp_path / "f" / "sub", ["--cpu"], "cannot create its logs/ directory"),
    }[case]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    proc = _gpu_check(tmp_path, *args, out=out)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and err.startswith("gpu_check: ") and words in err, err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "f").read_text() == "mine"
    assert json.loads((tmp_path / "mine" / "facts.json").read_text()) == {"mine": 1}


# every script of the same shape: counts with ranges, outputs that are not directories nor a user's other file
@pytest.mark.parametrize("name, argv, words", [
    ("bench_encode", ["--repeat", "0"], "argument --repeat: expected a whole number >= 1"),
    ("bench_encode", ["--json", "{tmp}"], "argument --json: {tmp}: is a directory"),
    ("bench_gpu", ["--json", "{tmp}/out.json", "--steps", "1"], "argument --steps: expected a whole number >= 2"),
    ("bench_gpu", ["--json", "{tmp}/notes.txt"], "argument --json: {tmp}/notes.txt: exists and is not JSON"),
    ("bench_gpu", ["--json", "{tmp}/o.json", "--sample-s", "0"], "argument --sample-s: expected a finite number > 0"),
    ("bench_index", ["--k", "0"], "argument --k: expected a whole number >= 1"),
    ("bench_index", ["--qa", "{tmp}"], "argument --qa: {tmp}: is a directory, not a file"),
    ("bench_malloc", ["--steps", "1"], "argument --steps: expected a whole number >= 2"),
    ("bench_rerank", ["--steps", "1"], "argument --steps: expected a whole number >= 2"),
    ("bench_rerank", ["--lr", "nan"], "argument --lr: expected a finite number > 0"),
    ("bench_train", ["--steps", "1"], "argument --steps: expected a whole number >= 2"),
    ("bench_train", ["--json", "{tmp}"], "argument --json: {tmp}: is a directory"),
    ("profile_step", ["--attention-dropout", "1.5"], "argument --attention-dropout: expected a finite number in [0, 1]"),
    ("profile_step", ["--md", "{tmp}"], "argument --md: {tmp}: is a directory"),
    ("check_export", ["--qa", "{tmp}/absent", "--passages", "{tmp}/notes.txt"], "argument --qa: {tmp}/absent: no such file"),
    ("mine_negatives", ["--dataset", "{tmp}", "--miner", "bm25", "--output", "{tmp}/notes.txt"],
     "argument --output: {tmp}/notes.txt: exists and is not a DPR results JSON"),
    ("mine_negatives", ["--dataset", "{tmp}", "--miner", "bm25", "--output", "{tmp}"],
     "argument --output: {tmp}: is a directory"),
    ("mine_negatives", ["--dataset", "{tmp}", "--miner", "bm25", "--output", "{tmp}/m.json", "--depth", "0"],
     "argument --depth: expected a whole number >= 1"),
    ("interpolate_weights", ["--model", "m", "--data-dir", "d", "--out", "{tmp}/notes.txt"],
     "argument --out: {tmp}/notes.txt: exists and is not JSON"),
    ("reader_answer_rule", ["--model", "m", "--data-dir", "d", "--results", "r", "--out", "{tmp}"],
     "argument --out: {tmp}: is a directory"),
    ("transfer_matrix", ["--out", "{tmp}"], "argument --out: {tmp}: holds files this script did not write"),
    ("transfer_matrix", ["--out", "{tmp}/notes.txt"], "argument --out: {tmp}/notes.txt: exists and is not a directory"),
    ("ablate_training", ["--out", "{tmp}"], "argument --out: {tmp}: holds files this script did not write"),
    ("pca_truncation", ["--json", "{tmp}"], "argument --json: {tmp}: is a directory"),
    ("bench_gpu", ["--json", "{tmp}/o.json", "--stages", ","], "argument --stages: expected a comma list of at least one"),
    ("bench_gpu", ["--json", "{tmp}/o.json", "--device", "cpu", "--stages", "train,bogus"], "argument --stages: unknown stage(s) ['bogus']"),
    ("interpolate_weights", ["--model", "m", "--data-dir", "d", "--out", "{tmp}/o.json", "--alphas", "1,2"],
     "argument --alphas: expected a finite number in [0, 1], got '2'"),
    ("reader_answer_rule", ["--model", "m", "--data-dir", "d", "--results", "r", "--out", "{tmp}/o.json", "--ks", ","],
     "argument --ks: expected a comma list of at least one item"),
    ("backbone_table", ["lora", "nameonly"], "argument NAME=RUN_DIR: expected NAME=RUN_DIR"),
    ("backbone_table", ["dims", "a={tmp}", "--dims", "0"], "argument --dims: expected a whole number >= 1"),
    ("results_tables", ["save", "{tmp}/notes.txt", "../../escape"], "argument name: expected a report name"),
    ("results_tables", ["save", "{tmp}", "x"], "argument report: {tmp}: is a directory, not a file"),
    ("results_tables", ["save", "{tmp}/notes.txt", "x"], "{tmp}/notes.txt: not JSON"),
    ("gpu_check_stages", ["compare", "a.json", "b.json", "{tmp}"], "argument out: {tmp}: is a directory"),
    ("gpu_check_stages", ["ddp"], "the following arguments are required: out"),
    ("gpu_check_stages", [], "the following arguments are required: cmd"),
])
def test_every_script_refuses_bad_arguments_in_one_line(tmp_path, capsys, name, argv, words):
    (tmp_path / "notes.txt").write_text("mine")
    argv = [a.format(tmp=tmp_path) for a in argv]
    one_line_exit_2(lambda: script(name).main(argv), capsys, words.format(tmp=tmp_path))
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_an_output_directory_is_claimed_and_reused(tmp_path):
    """owned_dir: new and empty directories are accepted; once claimed, a rerun is accepted with its outputs in it."""
    check = args_mod.owned_dir(".dpr-x", "result.json")
    assert check(str(tmp_path / "new")) == tmp_path / "new"
    args_mod.claim_dir(tmp_path / "new", ".dpr-x", "x.py")
    (tmp_path / "new" / "result.json").write_text("{}")
    assert check(str(tmp_path / "new")) == tmp_path / "new"
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "result.json").write_text("{}")  # an earlier run's, before the marker
    assert check(str(tmp_path / "old")) == tmp_path / "old"
