"""Nothing the user owns is replaced, and imports that would train on nothing or on ids are refused.

`dpr.atomic.atomic_path` exchanged whatever stood at an output path with the new output and deleted it: a
directory of the user's files under a file output, or ``data_dir/<name>`` of ``data.name=../victim``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpr.atomic import atomic_path, write_json_atomic
from dpr.data.prepare import prepare_dataset
from dpr.data.prepare.import_ import collect
from dpr.errors import DataError


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _user_dir(path: Path) -> dict[str, bytes]:
    (path / "sub").mkdir(parents=True)
    for i in range(3):
        (path / f"notes{i}.txt").write_text(f"mine {i}")
    (path / "sub" / "deep.txt").write_text("deep")
    return _tree(path)


# --- atomic_path: what may stand at an output path --------------------------------------------------------

def test_a_file_output_never_replaces_a_directory(tmp_path):
    out = tmp_path / "out.json"
    before = _user_dir(out)
    with pytest.raises(FileExistsError, match="is a directory, and this command writes a file there"):
        write_json_atomic(out, {"a": 1})
    assert _tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileExistsError):  # not even an empty one: the user meant a file *in* it, perhaps
        write_json_atomic(empty, {})
    assert empty.is_dir()


def test_a_directory_output_replaces_only_its_own_earlier_output(tmp_path):
    out = tmp_path / "index"
    before = _user_dir(out)
    with pytest.raises(FileExistsError, match=r"holding files this command does not write \(notes1.txt, notes2.txt, sub\)"):
        with atomic_path(out) as t:
            t.mkdir()
            (t / "notes0.txt").write_text("new")
    assert _tree(out) == before
    # with an ownership check: refused before the block runs at all
    ran = []
    with pytest.raises(FileExistsError, match="is a directory this command did not write"):
        with atomic_path(out, owned=lambda d: (d / "meta.json").is_file()):
            ran.append(1)
    assert not ran and _tree(out) == before
    # a file under a directory output
    f = tmp_path / "file"
    f.write_text("mine")
    with pytest.raises(FileExistsError, match="is a file, and this command writes a directory there"):
        with atomic_path(f, owned=lambda d: True) as t:
            t.mkdir()
    assert f.read_text() == "mine"
    # the writer's own output (same layout, or its marker) and an empty directory are replaced as before
    own = tmp_path / "own"
    for tag in ("one", "two"):
        with atomic_path(own) as t:
            t.mkdir()
            (t / "a").write_text(tag)
    (tmp_path / "empty").mkdir()
    with atomic_path(tmp_path / "empty", owned=lambda d: False) as t:
        t.mkdir()
        (t / "meta.json").write_text("{}")
    with atomic_path(tmp_path / "empty", owned=lambda d: (d / "meta.json").is_file()) as t:
        t.mkdir()
        (t / "meta.json").write_text("[]")
    assert (own / "a").read_text() == "two" and (tmp_path / "empty" / "meta.json").read_text() == "[]"


# --- dpr-data: data.name and data_dir/<name> --------------------------------------------------------------

def _flag_file(path: Path, n: int = 6) -> Path:
    rows = [{"query": f"where do animals{i} live", "pos": [f"animals{i} live in nests."],
             "neg": [f"animals{i + 1} live in caves."]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _import(src: Path, data_dir: Path, name: str, fmt: str = "flagembedding", **kw) -> Path:
    return prepare_dataset({"name": name, "recipe": "import", "format": fmt, "path": str(src), **kw}, data_dir)


@pytest.mark.parametrize("name", ["../victim", "a/b", "/abs", "..", "."])
def test_a_dataset_name_is_one_path_component(tmp_path, name):
    victim = tmp_path / "victim"
    before = _user_dir(victim)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with pytest.raises(DataError, match=r"field 'name': .* is not a dataset name: give one word"):
        _import(_flag_file(tmp_path / "f.jsonl"), data_dir, name)
    assert _tree(victim) == before and list(data_dir.iterdir()) == []


def test_a_user_directory_under_data_dir_is_not_replaced_but_a_prepared_dataset_is(tmp_path):
    data_dir = tmp_path / "data"
    before = _user_dir(data_dir / "mine")
    src = _flag_file(tmp_path / "f.jsonl")
    with pytest.raises(FileExistsError, match=r"mine: is a directory this command did not write"):
        _import(src, data_dir, "mine")
    assert _tree(data_dir / "mine") == before and sorted(p.name for p in data_dir.iterdir()) == ["mine"]
    root = _import(src, data_dir, "ours")
    _flag_file(src, n=8)  # other sources: the prepared dataset is rebuilt in place
    assert _import(src, data_dir, "ours") == root
    assert json.loads((root / "meta.json").read_text())["counts"]["records"] == 8


# --- imports that would train on nothing, or on ids --------------------------------------------------------

def test_id_triples_without_a_corpus_are_refused(tmp_path):
    ids = tmp_path / "triples.train.small.tsv"
    ids.write_text("1185869\t8240\t6137\n1185868\t412\t7001\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"triples\.train\.small\.tsv:1: field 'positive': no passage has more than "
                                        r"one word .*'8240', '6137'.* pass data.corpus=") as err:
        collect("triples", {"train": ids})
    assert "\n" not in str(err.value)
    with pytest.raises(DataError, match="pass data.corpus="):
        _import(ids, tmp_path / "data", "ms", fmt="triples")
    assert not (tmp_path / "data" / "ms").exists()
    # with the collection the same file imports; text triples need none
    (tmp_path / "collection.tsv").write_text("8240\tone passage\n6137\ttwo\n412\tthree\n7001\tfour\n")
    assert len(collect("triples", {"train": ids, "corpus": tmp_path / "collection.tsv"}).questions) == 2
    (tmp_path / "text.tsv").write_text("why\tbecause it is\tnot this one\n")
    assert len(collect("triples", {"train": tmp_path / "text.tsv"}).questions) == 1


@pytest.mark.parametrize("fmt, name", [("flagembedding", "e.jsonl"), ("tevatron", "e.jsonl"), ("triples", "e.tsv"),
                                       ("sentence_transformers", "e.jsonl")])
def test_an_empty_import_is_refused_naming_the_file(tmp_path, fmt, name):
    src = tmp_path / name
    src.write_text("\n\n" if fmt != "sentence_transformers" else "", encoding="utf-8")
    data_dir = tmp_path / "data"
    with pytest.raises((DataError, ValueError)) as err:
        _import(src, data_dir, "empty", fmt=fmt)
    assert str(err.value).startswith(str(src)) and "\n" not in str(err.value), str(err.value)
    assert not (data_dir / "empty").exists()
