"""scripts/bench_encode_memory.py end to end on a tiny corpus: both checkouts measured in fresh processes, their
peaks, growth laws and output digests in the --json report, and its one-line refusals."""

from __future__ import annotations

import json
import sys

import pytest

from dpr.data.passages import write_passages
from tests.conftest import REPO
from tests.scripts import script


@pytest.mark.slow
def test_both_checkouts_are_measured_and_write_the_same_shards(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts scripts/ on it
    write_passages(tmp_path / "p.tsv", [(f"id{i}", f"passage number {i}", "T") for i in range(40)])
    out = tmp_path / "mem.json"
    script("bench_encode_memory").main(["--passages", str(tmp_path / "p.tsv"),
                                        "--peer", str(REPO), "--work", str(tmp_path / "work"), "--json", str(out),
                                        "--num-shards", "2", "--shard-id", "1"])
    rep = json.loads(out.read_text())
    for label in ("this", "peer"):
        runs = rep["runs"][label]
        assert [(r["passages"], r["encoded"]) for r in runs.values()] == [(40, 20)]
        for r in runs.values():
            assert all(r["peak"][k] >= r["before"][k] > 0 for k in ("VmRSS", "RssAnon"))
            assert r["build"]["peak"]["VmRSS"] > 0 and set(r["files"]) == {
                "shard_001_of_002.npy", "shard_001_of_002.ids.txt", "shard_001_of_002.json"}
        assert set(rep["laws"][label]) == {"VmRSS", "RssAnon", "RssFile"}
    assert all(r["identical"] for r in rep["ratio"].values())  # one code, the same bytes


def test_a_shard_id_past_the_shards_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "p.tsv").write_text("id\ttext\ttitle\n")
    with pytest.raises(SystemExit) as stop:
        script("bench_encode_memory").main(["--passages", str(tmp_path / "p.tsv"), "--num-shards", "2",
                                            "--shard-id", "2"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "argument --shard-id: must be below --num-shards (2), got 2 (--help for usage)")
