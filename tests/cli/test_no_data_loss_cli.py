"""Every output path of every command, given something the user owns: refused in one line, exit 2,
nothing on disk changed. Before, `dpr.atomic.replace_path` exchanged a directory at a file output with the
new file and deleted it (dpr-data export, dpr-bm25, dpr-retrieve, dpr-rerank score, ...), `dpr-export`
replaced another model's export, a file (or a symlink loop) as output_dir was "[Errno 17] File exists", and
a missing local model was Hugging Face's "Repo id must be in the form ..."."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.run_command import refusal_line as _one_line, run_command


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run_command(args, cwd=cwd)  # in-process: the refusals are what the command prints and returns


def _tree(root: Path) -> dict[str, bytes]:
    """Every path under ``root`` (symlinks as their target), with file contents."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = os.readlink(p).encode() if p.is_symlink() else p.read_bytes() if p.is_file() else b"<dir>"
    return out


@pytest.fixture()
def place(tmp_path) -> Path:
    """A launch directory holding the user's things: ``mine/`` (files and a sub-directory), ``file``, ``loop``."""
    (tmp_path / "mine" / "sub").mkdir(parents=True)
    for i in range(7):
        (tmp_path / "mine" / f"f{i}.txt").write_text(f"user file {i}")
    (tmp_path / "mine" / "sub" / "deep.txt").write_text("deep")
    (tmp_path / "file").write_text("a user file")
    os.symlink("loop", tmp_path / "loop")
    (tmp_path / "r.json").write_text("[]")
    return tmp_path


def test_a_directory_at_every_file_output_is_refused(place, tiny_model_dir):
    m = str(tiny_model_dir)
    commands = [
        ("dpr-data", "export", "data=x", f"data_dir={place}", "format=triples", "output=mine"),
        ("dpr-bm25", "data=squad1_open", f"data_dir={place}", "output=mine"),
        ("dpr-bm25", "passages=p.tsv", "qa=q.tsv", "output=mine"),
        ("dpr-retrieve", "mode=hybrid", "bm25=r.json", "dense=r.json", "output=mine"),
        ("dpr-retrieve", f"model={m}", "index=i", "passages=p.tsv", "qa=q.tsv", "output=mine"),
        ("dpr-index", "embeddings=e", "output=mine"),
        ("dpr-rerank", "score", f"model={m}", "results=r.json", "output=mine"),
        ("dpr-rerank", "teacher-scores", f"model={m}", "data=squad1_open", "output=mine"),
        ("dpr-reader", "eval", f"model={m}", "results=r.json", "output=mine"),
    ]
    before = _tree(place)
    for cmd in commands:
        _one_line(_cli(place, *cmd), f"{place / 'mine'}: is a directory, and this command writes a file there")
        assert _tree(place) == before, cmd


def test_dpr_export_replaces_only_an_export_of_the_same_model(place, tiny_model_dir):
    from dpr.export.marker import MARKER

    before = _tree(place)
    _one_line(_cli(place, "dpr-export", f"model={tiny_model_dir}", "output=mine"),
              f"{place / 'mine'}: is a directory this command did not write")
    other = place / "other_export"  # another model's export: its marker names another source
    other.mkdir()
    (other / "modules.json").write_text("[]")
    (other / MARKER).write_text(json.dumps({"exported_by": "dpr-export", "source": str(place / "another_run")}))
    before = _tree(place)
    _one_line(_cli(place, "dpr-export", f"model={tiny_model_dir}", "output=other_export"),
              "is a directory this command did not write")
    _one_line(_cli(place, "dpr-export", f"model={tiny_model_dir}", "output=file"), "exists and is not a directory")
    assert _tree(place) == before


def test_dpr_bm25_index_dir_that_is_a_user_directory_is_refused(place, tiny_data_dir):
    before = _tree(place)
    proc = _cli(place, "dpr-bm25", f"passages={tiny_data_dir / 'tiny' / 'passages.tsv'}",
                f"qa={tiny_data_dir / 'tiny' / 'dev.qa.tsv'}", "index_dir=mine", "output=out.json")
    _one_line(proc, f"{place / 'mine'}: is a directory this command did not write")
    assert _tree(place) == before


@pytest.mark.parametrize("target", ["file", "loop"])
def test_output_dir_that_is_a_file_or_a_symlink_loop_is_one_clear_line(place, tiny_model_dir, target):
    words = "exists and is not a directory" if target == "file" else "a symlink that does not lead to a directory"
    commands = [
        ("dpr-train", "data=squad1_open", f"output_dir={target}"),
        ("dpr-eval", "results=[r.json]", f"output_dir={target}"),
        ("dpr-encode", f"model={tiny_model_dir}", "passages=p.tsv", f"output_dir={target}"),
        ("dpr-rerank", "train", "data=squad1_open", f"output_dir={target}"),
        ("dpr-reader", "train", "data=squad1_open", f"output_dir={target}"),
        ("dpr-pipeline", "data=squad1_open", f"output_dir={target}"),
        ("dpr-data", "inspect", "data=x", f"data_dir={place}", f"output={target}"),
        ("dpr-data", "data=squad1_open", f"data_dir={target}"),
    ]
    before = _tree(place)
    for cmd in commands:
        line = _one_line(_cli(place, *cmd), f"{place / target}: {words}")
        assert "Errno" not in line
        assert _tree(place) == before, cmd


def test_a_missing_model_directory_is_named_for_every_model_key(place, tmp_path):
    missing = "/nonexistent/dir"
    commands = [
        ("model.name", ("dpr-train", "data=squad1_open", f"model.name={missing}", "output_dir=run")),
        ("model.name", ("dpr-pipeline", "data=squad1_open", f"model.name={missing}", "output_dir=run")),
        ("model.name", ("dpr-data", "inspect", "data=x", f"data_dir={place}", f"model.name={missing}", "output=rep")),
        ("rerank.model", ("dpr-rerank", "train", "data=squad1_open", f"rerank.model={missing}", "output_dir=run")),
        ("reader_cfg.model", ("dpr-reader", "train", "data=squad1_open", f"model={missing}", "output_dir=run")),
        ("reader_model", ("dpr-reader", "eval", f"model={missing}", "results=r.json", "output=o.json")),
        ("model_path", ("dpr-rerank", "score", f"model={missing}", "results=r.json", "output=o.json")),
        ("model_path", ("dpr-export", f"model={missing}", "output=exp")),
    ]
    for key, cmd in commands:
        line = _one_line(_cli(place, *cmd), f"{key}: model not found: {missing} (no such directory)")
        assert "Repo id" not in line
        assert not (place / "run" / "train_summary.json").exists() and not (place / "exp").exists()
    assert not any(p.name.startswith(".hydra.pending") for p in place.rglob("*"))


def test_dpr_data_name_outside_data_dir_or_over_a_user_directory_is_refused(place):
    src = place / "flag.jsonl"
    src.write_text("".join(json.dumps({"query": f"where do owls{i} live", "pos": [f"owls{i} live in trees."],
                                       "neg": ["bees live in hives."]}) + "\n" for i in range(5)))
    data_dir = place / "data"
    data_dir.mkdir()
    before = _tree(place)
    base = ("dpr-data", "data=import", "data.format=flagembedding", f"data.path={src}", f"data_dir={data_dir}")
    _one_line(_cli(place, *base, "data.name=../mine"), "field 'name': '../mine' is not a dataset name")
    os.symlink(place / "mine", data_dir / "linked")  # a name whose directory holds the user's files
    (data_dir / "plain").mkdir()
    (data_dir / "plain" / "keep.txt").write_text("mine")
    before = _tree(place)
    _one_line(_cli(place, *base, "data.name=plain"), f"{data_dir / 'plain'}: is a directory this command did not write")
    assert _tree(place) == before


def test_commands_writing_into_an_output_directory_keep_the_users_files(place, tiny_model_dir, tiny_data_dir):
    """``output_dir=`` of dpr-encode and dpr-eval is a directory the command writes its own files into: a directory
    of the user's is used as it is, none of the user's files changed or removed."""
    before = _tree(place / "mine")
    res = place / "res.json"
    res.write_text(json.dumps([{"question": "q", "answers": ["a"], "ctxs": [
        {"id": "p1", "title": "t", "text": "a b", "score": 1.0, "has_answer": True}]}]))
    for cmd in (("dpr-eval", f"results=[{res}]", "output_dir=mine", "resamples=10"),
                ("dpr-encode", f"model={tiny_model_dir}", f"passages={tiny_data_dir / 'tiny' / 'passages.tsv'}",
                 "output_dir=mine")):
        proc = _cli(place, *cmd)
        assert proc.returncode == 0, proc.stderr[-3000:]
        after = _tree(place / "mine")
        assert {k: after[k] for k in before} == before and len(after) > len(before), cmd
