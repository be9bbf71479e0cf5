"""`dpr-bm25`'s ``shard_passages`` and ``n_threads`` keys reach the index build and the search (in-process)."""

from __future__ import annotations

import importlib

import pytest

from dpr.bm25.shards import SHARDS_DIR
from dpr.data.results import read_results
from tests.run_command import refusal_line, run_command


@pytest.fixture
def searches(monkeypatch):
    """Each BM25 search as ``(shards of the index searched, or None for one bm25s index; n_threads)``."""
    bm25_search = importlib.import_module("dpr.bm25.search")  # the module (dpr.bm25.search is also a function)

    seen: list[tuple[int | None, int]] = []
    real = bm25_search.search_indices

    def spy(index, queries, k=100, n_threads=-1, show_progress=True):
        seen.append((None if index.shards is None else len(index.shards), n_threads))
        return real(index, queries, k, n_threads=n_threads, show_progress=show_progress)

    monkeypatch.setattr(bm25_search, "search_indices", spy)
    return seen


def test_standalone_search_takes_both_keys(tiny_data_dir, tmp_path, searches):
    root = tiny_data_dir / "tiny"
    given = [f"passages={root / 'passages.tsv'}", f"qa={root / 'test.qa.tsv'}", "k=5"]
    plain = run_command(["dpr-bm25", *given, f"output={tmp_path / 'plain.json'}"], cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    sharded = run_command(["dpr-bm25", *given, f"output={tmp_path / 'sharded.json'}", "shard_passages=3",
                           "n_threads=2"], cwd=tmp_path)
    assert sharded.returncode == 0, sharded.stderr
    assert searches == [(None, 0), (3, 2)]  # the defaults: one index, the calling thread; then 8 passages in 3s
    # how the index is built and searched changes no ranking
    assert read_results(tmp_path / "sharded.json") == read_results(tmp_path / "plain.json")


def test_dataset_mining_takes_both_keys(tiny_data_dir, tmp_path, searches):
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    proc = run_command(["dpr-bm25", "data=tiny", f"data_dir={tiny_data_dir}", f"hydra.searchpath=[file://{conf}]",
                        "mine=true", "num_negatives=2", "shard_passages=4", "n_threads=-1"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert searches and set(searches) == {(2, -1)}  # the cached index built in shards of 4; every split's search
    saved = tiny_data_dir / "tiny" / "bm25_index" / SHARDS_DIR
    assert sorted(p.name for p in saved.iterdir()) == ["00000", "00001"]  # the cache holds the two shards


@pytest.mark.parametrize("key,value", [("shard_passages", "0"), ("n_threads", "-2"), ("shard_passages", "x")])
def test_out_of_range_values_are_one_line(tiny_data_dir, tmp_path, key, value):
    root = tiny_data_dir / "tiny"
    proc = run_command(["dpr-bm25", f"passages={root / 'passages.tsv'}", f"qa={root / 'test.qa.tsv'}",
                        f"output={tmp_path / 'out.json'}", f"{key}={value}"], cwd=tmp_path)
    refusal_line(proc, key)
    assert not (tmp_path / "out.json").exists()
