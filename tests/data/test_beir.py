"""Any BEIR folder: ``dpr-data data=beir data.path=<folder>`` prepares ``<data_dir>/<folder name>/``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dpr.data.beir import read_qrels, read_queries, write_beir_corpus, write_qrels, write_queries
from dpr.data.dataset import DatasetPaths
from dpr.data.passages import iter_passages
from dpr.data.retriever_json import read_retriever_json
from dpr.errors import DataError
from tests.run_command import run_command


def make_beir_folder(root: Path, splits: tuple[str, ...], n_queries: int = 20) -> Path:
    docs = [{"id": f"d{i}", "title": f"Doc {i}", "text": f"document number {i} about topic {i % 5}"} for i in range(30)]
    docs.append({"id": "d_empty", "title": "Only a title", "text": ""})
    write_beir_corpus(root / "corpus.jsonl", docs)
    write_queries(root / "queries.jsonl", {f"q{i}": f"what about topic {i % 5} number {i}" for i in range(n_queries)})
    qids = [f"q{i}" for i in range(n_queries)]
    chunks = {"train": qids[:12], "dev": qids[12:15], "test": qids[15:]}
    if "dev" not in splits:
        chunks["test"] = qids[12:]
    for split in splits:
        write_qrels(root / "qrels" / f"{split}.tsv", {q: {f"d{int(q[1:])}": 2, f"d{int(q[1:]) + 1}": 1, "d_empty": 0}
                                                     for q in chunks[split]})
    return root


def dpr_data(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_command(["dpr-data", "data=beir", *args], cwd=cwd)  # the console script's main, in-process


def test_folder_with_its_own_splits(tmp_path):
    folder = make_beir_folder(tmp_path / "mybeir", ("train", "dev", "test"))
    proc = dpr_data(f"data.path={folder}", f"data_dir={tmp_path / 'prepared'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ds = DatasetPaths(tmp_path / "prepared" / "mybeir")
    assert proc.stdout.strip().endswith(str(ds.root))
    assert ds.kind == "qrels" and ds.read_meta()["recipe"] == "beir"
    for split in ("train", "dev", "test"):
        assert read_qrels(ds.qrels(split)) == read_qrels(folder / "qrels" / f"{split}.tsv")
    assert read_queries(ds.queries) == read_queries(folder / "queries.jsonl")
    passages = {p["id"]: p for p in iter_passages(ds.passages)}
    assert len(passages) == 31 and passages["d_empty"]["text"] == "Only a title"
    train = read_retriever_json(ds.train)
    assert [ex["query_id"] for ex in train] == [f"q{i}" for i in range(12)]
    first = train[0]
    assert [c["passage_id"] for c in first["positive_ctxs"]] == ["d0", "d1"]  # relevance 2 first; 0 is not positive
    assert first["answers"] == [] and len(read_retriever_json(ds.dev)) == 3
    counts = ds.read_meta()["counts"]
    assert counts["questions"] == {"train": 12, "dev": 3, "test": 5}

    again = dpr_data(f"data.path={folder}", f"data_dir={tmp_path / 'prepared'}", cwd=tmp_path)
    assert again.returncode == 0 and "up to date" in again.stdout + again.stderr

    # the later commands find the dataset by the same config (its name is the folder's)
    bm25 = run_command(["dpr-bm25", "data=beir", f"data.path={folder}", f"data_dir={tmp_path / 'prepared'}",
                        "split=test", f"output={tmp_path / 'bm25.trec'}"], cwd=tmp_path)
    assert bm25.returncode == 0, bm25.stderr
    from dpr.data.results import read_trec_run

    assert sorted(read_trec_run(tmp_path / "bm25.trec")) == sorted(f"q{i}" for i in range(15, 20))


def test_folder_without_dev_gets_a_seeded_dev_split(tmp_path):
    from dpr.data.prepare import prepare_dataset

    folder = make_beir_folder(tmp_path / "nodev", ("train", "test"))
    cfg = {"name": "nodev", "recipe": "beir", "kind": "qrels", "path": str(folder), "seed": 3, "dev_fraction": 0.25}
    ds = DatasetPaths(prepare_dataset(cfg, tmp_path / "a"))
    train, dev = read_qrels(ds.qrels("train")), read_qrels(ds.qrels("dev"))
    original = read_qrels(folder / "qrels" / "train.tsv")
    assert len(dev) == 3 and len(train) == 9 and not set(train) & set(dev)
    assert {**train, **dev} == original  # the train queries, split in two
    assert [ex["query_id"] for ex in read_retriever_json(ds.dev)] == list(dev)
    assert any("became dev" in n for n in ds.read_meta()["notes"])
    # seeded: the same split elsewhere; another seed, another split
    assert read_qrels(DatasetPaths(prepare_dataset(cfg, tmp_path / "b")).qrels("dev")) == dev
    other = read_qrels(DatasetPaths(prepare_dataset({**cfg, "seed": 4}, tmp_path / "c")).qrels("dev"))
    assert set(other) != set(dev)


def test_test_only_folder_and_bad_folders(tmp_path):
    from dpr.data.prepare import prepare_dataset

    folder = make_beir_folder(tmp_path / "testonly", ("test",))
    ds = DatasetPaths(prepare_dataset({"name": "testonly", "recipe": "beir", "path": str(folder)}, tmp_path / "p"))
    assert read_retriever_json(ds.train) == [] and not ds.qrels("train").exists()
    assert json.loads(ds.meta.read_text())["counts"]["questions"] == {"test": 8}

    (folder / "qrels" / "test.tsv").unlink()
    proc = dpr_data(f"data.path={folder}", f"data_dir={tmp_path / 'x'}", cwd=tmp_path)
    assert proc.returncode == 2 and "test.tsv" in proc.stderr
    proc = dpr_data(f"data_dir={tmp_path / 'x'}", cwd=tmp_path)
    assert proc.returncode == 2 and "data.path" in proc.stderr
    bad = make_beir_folder(tmp_path / "badqrels", ("train", "test"))
    with open(bad / "qrels" / "test.tsv", "a", encoding="utf-8") as f:
        f.write("q15\tnot_a_doc\t1\n")
    with pytest.raises(DataError, match="not_a_doc"):
        prepare_dataset({"name": "badqrels", "recipe": "beir", "path": str(bad)}, tmp_path / "y")
    assert not (tmp_path / "y" / "badqrels").exists()
