"""Rebuilding a prepared dataset (``force=true``, a changed recipe version) keeps the files the user put in its
directory: nq_open_dev asks for the user's ``passages.tsv`` there. Before, the directory was rebuilt aside and
swapped in, deleting them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dpr.atomic import OutputConflictError, sha256_file
from dpr.data.prepare import prepare_dataset

REPO = Path(__file__).resolve().parents[2]
CORPUS = "id\ttext\ttitle\n1\tthe user's own corpus\tmine\n"


def _cfg(name: str) -> dict:
    cfg = yaml.safe_load((REPO / "conf" / "data" / f"{name}.yaml").read_text())
    cfg.pop("mirror_dir"), cfg.pop("cache_dir")
    return cfg


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}


def _with_user_files(root: Path) -> None:
    (root / "passages.tsv").write_text(CORPUS)
    (root / "notes").mkdir()
    (root / "notes" / "where.txt").write_text("from the DPR release")


def test_force_rebuild_keeps_the_users_passages(mirror_dir, tmp_path):
    root = prepare_dataset(_cfg("nq_open_dev"), tmp_path, mirror_dir=mirror_dir)
    _with_user_files(root)
    (root / "test.qa.tsv").write_text("tampered\n")  # an output of the build: rebuilt, not kept
    prepare_dataset(_cfg("nq_open_dev"), tmp_path, mirror_dir=mirror_dir, force=True)
    assert (root / "passages.tsv").read_text() == CORPUS
    assert (root / "notes" / "where.txt").read_text() == "from the DPR release"
    assert (root / "test.qa.tsv").read_text() != "tampered\n"
    # a further rebuild still sees them as the user's (the meta names only the build's outputs)
    prepare_dataset(_cfg("nq_open_dev"), tmp_path, mirror_dir=mirror_dir, force=True)
    assert (root / "passages.tsv").read_text() == CORPUS


def test_a_recipe_version_bump_keeps_them_too(mirror_dir, tmp_path, monkeypatch):
    from dpr.data.prepare import nq_open_dev

    root = prepare_dataset(_cfg("nq_open_dev"), tmp_path, mirror_dir=mirror_dir)
    _with_user_files(root)
    monkeypatch.setattr(nq_open_dev, "VERSION", nq_open_dev.VERSION + 1)
    prepare_dataset(_cfg("nq_open_dev"), tmp_path, mirror_dir=mirror_dir)
    assert (root / "passages.tsv").read_text() == CORPUS


def test_a_user_file_where_the_rebuild_writes_is_refused(mirror_dir, tmp_path, monkeypatch):
    from dpr.data.prepare import nq_open_dev

    root = prepare_dataset(_cfg("nq_open_dev"), tmp_path, mirror_dir=mirror_dir)
    _with_user_files(root)
    build = nq_open_dev.build

    def build_with_passages(cfg, files, out):  # a recipe that now writes passages.tsv itself
        result = build(cfg, files, out)
        (out / "passages.tsv").write_text("id\ttext\ttitle\n")
        return result

    monkeypatch.setattr(nq_open_dev, "build", build_with_passages)
    before = _digests(root)
    with pytest.raises(OutputConflictError, match="passages.tsv: is not an output recorded by the earlier build"):
        prepare_dataset(_cfg("nq_open_dev"), tmp_path, mirror_dir=mirror_dir, force=True)
    assert _digests(root) == before
