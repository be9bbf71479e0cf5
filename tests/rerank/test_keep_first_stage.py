"""The rerank stage's "keep the first stage" rule: a system that reranking lowered on dev keeps its own list
as its ``+rerank`` row (`dpr.rerank.runs.lowers_dev`, `keep_first_stage`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpr.data.results import read_results, write_results, write_trec_run
from dpr.rerank.runs import first_stage_records, keep_first_stage, lowers_dev


def _system(reranked: float, first: float, k: int = 20, metric: str = "mrr") -> dict:
    # one entry of the rerank stage's dev.json "systems" (other depths carry other figures)
    return {"k": k, "weight": 0.5, "first_stage": {metric: first},
            "dev": {"5": {metric: 0.99}, str(k): {metric: reranked}}}


@pytest.mark.parametrize("reranked, first, lowered", [(0.344, 0.345, True), (0.345, 0.345, False),
                                                      (0.932, 0.918, False)])
def test_lowers_dev_is_strictly_below_the_first_stage_at_the_chosen_depth(reranked, first, lowered):
    assert lowers_dev(_system(reranked, first), "mrr") is lowered
    assert lowers_dev(_system(reranked, first, k=50, metric="ndcg@10"), "ndcg@10") is lowered


def test_a_kept_results_file_is_the_first_stage_byte_for_byte(tmp_path):
    records = [{"question": f"q{i}", "answers": ["a"], "ctxs": [
        {"id": str(j), "title": "t", "text": f"p{j}", "score": 1.0, "has_answer": j == i} for j in range(3)]}
        for i in range(2)]
    first = tmp_path / "bm25" / "test.json"
    write_results(first, records)
    out = tmp_path / "rerank" / "bm25"
    stats = keep_first_stage(first, out / "test.json", None, out / "stats.json", read_results(first))
    assert (out / "test.json").read_bytes() == first.read_bytes()  # equal scores keep their order too
    recorded = json.loads((out / "stats.json").read_text())
    assert stats == {k: v for k, v in recorded.items() if k != "files"}
    assert set(recorded["files"]) == {"test.json"}  # the stats name the list they were written with
    assert stats["kept_first_stage"] and stats["questions"] == 2 and stats["pairs"] == 0
    assert stats["seconds_per_question"] == 0.0 and stats["first_stage"] == str(first)


def test_a_kept_trec_run_is_copied_and_its_records_written(tmp_path):
    from dpr.data.passages import PassageLookup

    passages = tmp_path / "passages.tsv"
    passages.write_text("id\ttext\ttitle\nd1\tone\tT1\nd2\ttwo\tT2\nd3\tthree\tT3\n", encoding="utf-8")
    first = tmp_path / "hybrid" / "test.trec"
    write_trec_run(first, {"q1": {"d1": 0.5, "d2": 0.5, "d3": 0.9}, "q2": {"d2": 1.0}}, tag="hybrid")
    records = first_stage_records(first, {"q1": "first?", "q2": "second?"}, PassageLookup.from_file(passages))
    out = tmp_path / "rerank" / "hybrid"
    with pytest.raises(ValueError, match="TREC output path"):
        keep_first_stage(first, out / "test.json", None, out / "stats.json", records)
    assert not out.exists()  # nothing half-written
    keep_first_stage(first, out / "test.json", out / "test.trec", out / "stats.json", records)
    assert (out / "test.trec").read_bytes() == first.read_bytes()  # ties, scores and tag as the first stage had them
    kept = read_results(out / "test.json")
    assert [[c["id"] for c in r["ctxs"]] for r in kept] == [["d3", "d1", "d2"], ["d2"]]
    assert json.loads((out / "stats.json").read_text())["questions"] == 2


def test_a_kept_list_killed_between_its_moves_is_refused_on_read(tmp_path, monkeypatch):
    """The kept list and its stats move in as one set (stats last): a kill after the list moved leaves the old
    stats, which name the old list, and dpr-eval refuses the pair in one line instead of scoring it."""
    import dpr.atomic
    from dpr.errors import DataError
    from dpr.eval.report import evaluate_qa

    def records(score):
        return [{"question": f"q{i}", "answers": ["a"], "ctxs": [
            {"id": str(j), "title": "t", "text": f"p{j}", "score": score, "has_answer": j == i} for j in range(3)]}
            for i in range(2)]

    out = tmp_path / "rerank" / "bm25"
    for n, score in enumerate((1.0, 2.0)):
        first = tmp_path / f"first{n}.json"
        write_results(first, records(score))
        if n == 1:  # the second keep is killed after its first move into ``out``
            real = dpr.atomic.replace_path

            def replace(new, path, aside):
                if Path(path).parent == out and Path(path).name == "stats.json":
                    raise OSError("killed here")
                real(new, path, aside)

            monkeypatch.setattr(dpr.atomic, "replace_path", replace)
            with pytest.raises(OSError, match="killed here"):
                keep_first_stage(first, out / "test.json", None, out / "stats.json", read_results(first))
            monkeypatch.undo()
        else:
            keep_first_stage(first, out / "test.json", None, out / "stats.json", read_results(first))
    with pytest.raises(DataError, match="field 'files': not the file stats.json was written with"):
        evaluate_qa({"x": out / "test.json"}, tmp_path / "eval", ks=[1], num_resamples=20)
