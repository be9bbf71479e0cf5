"""Careless paths are refused in one line naming the key or the directory, exit 2, before any work and with nothing
made: an output under a read-only directory (a read-only tmpfs where the machine lets root mount one; as root,
permission bits are not enough) or under a path that is a file, an empty path (``output_dir=`` would otherwise be the
launch directory itself), and a directory where an input file goes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import directory_tree
from tests.run_command import refusal_line, run_command


@pytest.fixture()
def run_dir(tiny_model_dir, tmp_path) -> Path:
    from dpr.models import BiEncoderConfig, build_biencoder, save_biencoder

    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_model_dir)))
    save_biencoder(model, tok, tmp_path / "run")
    return tmp_path / "run"


def _bm25(tiny_data_dir: Path, index_dir: Path, out: Path) -> list[str]:
    tiny = tiny_data_dir / "tiny"
    return ["dpr-bm25", f"passages={tiny / 'passages.tsv'}", f"qa={tiny / 'test.qa.tsv'}", f"output={out}",
            f"index_dir={index_dir}"]


def test_bm25_index_dir_under_a_read_only_directory_is_named_before_the_build(tiny_data_dir, tmp_path, read_only_dir):
    proc = run_command(_bm25(tiny_data_dir, read_only_dir / "idx", tmp_path / "bm25.json"), cwd=tmp_path)
    refusal_line(proc, f"{read_only_dir}: cannot write idx there (read-only file system)")
    assert "BM25 tokenize" not in proc.stderr and not (tmp_path / "bm25.json").exists()  # before: after the build


def test_bm25_index_dir_under_a_file_is_named_before_the_build(tiny_data_dir, tmp_path):
    (tmp_path / "afile").write_text("mine")
    proc = run_command(_bm25(tiny_data_dir, tmp_path / "afile" / "idx", tmp_path / "bm25.json"), cwd=tmp_path)
    refusal_line(proc, f"{tmp_path / 'afile' / 'idx'}: cannot be created, {tmp_path / 'afile'} is not a directory")
    assert "BM25 tokenize" not in proc.stderr  # before: "[Errno 17] File exists: '<afile>'" after the build


def test_export_under_a_read_only_directory_is_named_before_the_export(run_dir, tmp_path, read_only_dir):
    proc = run_command(["dpr-export", f"model={run_dir}", f"output={read_only_dir / 'export'}"], cwd=tmp_path)
    refusal_line(proc, f"output {read_only_dir / 'export'}: {read_only_dir} is not writable (Read-only file system)")


def test_export_under_a_file_is_one_clear_line(run_dir, tmp_path):
    (tmp_path / "afile").write_text("mine")
    proc = run_command(["dpr-export", f"model={run_dir}", f"output={tmp_path / 'afile' / 'export'}"], cwd=tmp_path)
    refusal_line(proc, f"output {tmp_path / 'afile' / 'export'}: cannot be created, {tmp_path / 'afile'} is not a "
                       "directory")  # before: "[Errno 17] File exists"


def test_every_other_output_under_a_read_only_directory_is_named_first(tiny_model_dir, tiny_data_dir, tmp_path,
                                                                       read_only_dir):
    tiny = tiny_data_dir / "tiny"
    (tmp_path / "r.json").write_text("[]")
    for key, cmd in (("output_dir", ["dpr-encode", f"model={tiny_model_dir}", f"passages={tiny / 'passages.tsv'}"]),
                     ("output", ["dpr-index", f"embeddings={tmp_path}"]),
                     ("output", ["dpr-retrieve", f"model={tiny_model_dir}", f"index={tmp_path / 'i.faiss'}",
                                 f"qa={tiny / 'test.qa.tsv'}"]),
                     ("output_dir", ["dpr-eval", f"results=[{tmp_path / 'r.json'}]"]),
                     ("output", ["dpr-rerank", "score", f"model={tiny_model_dir}", f"results={tmp_path / 'r.json'}"])):
        out = read_only_dir / "x"
        proc = run_command([*cmd, f"{key}={out}"], cwd=tmp_path)
        refusal_line(proc, f"{key} {out}: {read_only_dir} is not writable (Read-only file system)")


@pytest.mark.parametrize("argv,line", [
    (["dpr-encode", "model={model}", "passages={tiny}/passages.tsv", "output_dir="],
     "config key output_dir: an empty path; give a directory"),  # before: exit 0, shards in the launch directory
    (["dpr-eval", "results=[{tmp}/r.json]", "output_dir="], "config key output_dir: an empty path; give a directory"),
    (["dpr-index", "embeddings={tmp}", "output="], "config key output: an empty path; give a file"),  # before: exit 1
    (["dpr-retrieve", "model={model}", "index={tmp}/i.faiss", "qa={tiny}/test.qa.tsv", "output="],
     "config key output: an empty path; give a file"),  # before: "[Errno 21] Is a directory: '<temporary path>'"
    (["dpr-train", "model.name={model}", "output_dir="], "config key output_dir: an empty path; give a directory"),
    (["dpr-eval", "results=['']", "output_dir={tmp}/ev"], "config key results: an empty path; give a file"),
    (["dpr-encode", "model={model}", "passages=", "output_dir={tmp}/emb"], "config key passages: an empty path"),
    (["dpr-encode", "model={model}", "passages={tmp}/adir", "output_dir={tmp}/emb"],
     "config key passages: {tmp}/adir is a directory; give a file"),  # before: output_dir made, then the error
    (["dpr-retrieve", "model={model}", "index={tmp}/i.faiss", "qa={tmp}/adir", "output={tmp}/d.json"],
     "config key qa: {tmp}/adir is a directory; give a file"),  # before: "[Errno 21] Is a directory"
    (["dpr-bm25", "passages={tmp}/adir", "qa={tiny}/test.qa.tsv", "output={tmp}/b.json"],
     "config key passages: {tmp}/adir is a directory; give a file"),
    (["dpr-eval", "results=[{tmp}/adir]", "output_dir={tmp}/ev"], "config key results: {tmp}/adir is a directory"),
    (["dpr-encode", "model=", "passages={tiny}/passages.tsv", "output_dir={tmp}/emb"],
     "config key model_path: an empty path; give a model"),  # before: Hugging Face's "Repo id must use ...", emb/ made
    (["dpr-export", "model=", "output={tmp}/ex"], "config key model_path: an empty path"),  # before: ".: not a run"
    (["dpr-index", "embeddings=", "output={tmp}/i.faiss"], "config key embeddings: an empty path"),
    (["dpr-train", "model.name={model}", "data_dir=", "output_dir={tmp}/t"], "config key data_dir: an empty path"),
], ids=lambda v: " ".join(v[:1] + [a for a in v if a.endswith("=") or "adir" in a or "''" in a]) if isinstance(v, list)
   else None)
def test_empty_paths_and_directories_for_files_are_one_line_with_nothing_made(argv, line, tiny_model_dir,
                                                                              tiny_data_dir, tmp_path):
    (tmp_path / "adir").mkdir()
    (tmp_path / "r.json").write_text("[]")
    fill = {"model": tiny_model_dir, "tiny": tiny_data_dir / "tiny", "tmp": tmp_path}
    before = directory_tree(tmp_path)
    proc = run_command([a.format(**fill) for a in argv], cwd=tmp_path)
    refusal_line(proc, line.format(**fill))
    assert directory_tree(tmp_path) == before
