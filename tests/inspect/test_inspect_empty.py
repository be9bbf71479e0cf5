"""An empty dataset is a finding: before, ``dpr-data inspect`` said "No warnings." of a dataset of
0 passages and 0 questions (every share of nothing is 0, under every threshold)."""

from __future__ import annotations

from pathlib import Path

from dpr.atomic import write_json_atomic
from dpr.data.passages import write_passages
from dpr.data.retriever_json import write_retriever_json
from dpr.inspect import compute
from dpr.inspect.report import markdown

CFG = {"model": {"name": "all-MiniLM-L6-v2", "question_max_length": 64, "passage_max_length": 8},
       "train": {"batch_size": 2, "hard_negatives": 1}}


def _dataset(root: Path, passages: list[tuple[str, str, str]], train: list[dict]) -> Path:
    root.mkdir(parents=True)
    write_passages(root / "passages.tsv", passages)
    write_retriever_json(root / "train.json", train)
    write_retriever_json(root / "dev.json", [])
    write_json_atomic(root / "meta.json", {"name": root.name, "kind": "qrels"})
    return root


def test_an_empty_dataset_is_warned_about(tmp_path):
    report = compute(_dataset(tmp_path / "empty", [], []), CFG)
    assert report["warnings"] == ["WARNING: the dataset has no training questions and no passages: there is nothing "
                                  "to train on (prepare it again from a file that holds records)"]
    assert "No warnings." not in markdown(report)
    ctx = {"passage_id": "p0", "title": "", "text": "a passage"}
    one = compute(_dataset(tmp_path / "one", [("p0", "a passage", "")], [
        {"question": "q", "answers": [], "positive_ctxs": [ctx], "negative_ctxs": [], "hard_negative_ctxs": [ctx],
         "query_id": "q"}]), {**CFG, "train": {"batch_size": 2, "hard_negatives": 0}})
    assert not any("nothing to train on" in w for w in one["warnings"])
