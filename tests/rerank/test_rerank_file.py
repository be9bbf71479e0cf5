"""``dpr-rerank score`` (`dpr.rerank.rerank_file`): a DPR results JSON or a TREC run reranked by the
pipeline's rule -- top k by the cross-encoder (or interpolated with the first stage), the rest as it was --
with a weight chosen on the file when a grid is given, and metrics before and after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpr.data.results import read_results, read_trec_run, write_results, write_trec_run
from tests.run_command import run_command

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ce_dir(tiny_model_dir, tmp_path_factory) -> Path:
    from dpr.rerank.model import build_cross_encoder, save_cross_encoder

    torch.manual_seed(0)
    model, tok = build_cross_encoder(str(tiny_model_dir))
    return save_cross_encoder(model.eval(), tok, tmp_path_factory.mktemp("ce") / "ce", {"max_length": 64, "title": True})


def _qa_results(path: Path, n: int = 4, depth: int = 6) -> list[dict]:
    recs = [{"question": f"what is item {i}", "answers": [f"answer{i}"],
             "ctxs": [{"id": f"d{i}-{j}", "title": f"T{j}", "text": f"text {j} " * (j + 1)
                       + (f"answer{i}" if j == 4 else ""), "score": 10.0 - j, "has_answer": j == 4}
                      for j in range(depth)]} for i in range(n)]
    write_results(path, recs)
    return recs


def _logits(ce_dir: Path, recs: list[dict], k: int) -> dict:
    from dpr.rerank.model import load_cross_encoder
    from dpr.rerank.runs import pair_scores

    model, tok, settings = load_cross_encoder(ce_dir)
    return pair_scores(model, tok, settings, [recs], k, precision="fp32")


def test_top_k_follows_the_cross_encoder_and_the_tail_stays(ce_dir, tmp_path):
    from dpr.rerank.rerank_file import rerank_file, stats_path

    recs = _qa_results(tmp_path / "dev.json")
    stats = rerank_file(ce_dir, tmp_path / "dev.json", tmp_path / "out.json", k=4, precision="fp32")
    logits = _logits(ce_dir, recs, 4)
    out = read_results(tmp_path / "out.json")
    for rec, new in zip(recs, out):
        head = [logits[(rec["question"], c["id"])] for c in rec["ctxs"][:4]]
        order = sorted(range(4), key=lambda j: (-head[j], j))
        assert [c["id"] for c in new["ctxs"]] == [rec["ctxs"][j]["id"] for j in order] + [
            c["id"] for c in rec["ctxs"][4:]]  # the passages past k keep their first-stage places
        assert [c["rerank_logit"] for c in new["ctxs"][:4]] == pytest.approx([head[j] for j in order], abs=1e-6)
    # the answer sits at rank 5: past k, so neither order finds it in the measured top 4
    assert stats["weight"] == 0.0 and stats["before"]["top1"] == stats["after"]["top1"] == 0.0
    assert stats["metric"] == "mrr" and stats["questions"] == 4 and stats["pairs"] == 16
    assert json.loads(stats_path(tmp_path / "out.json").read_text())["after"] == stats["after"]


def test_a_weight_grid_writes_the_best_weight_measured_on_the_file(ce_dir, tmp_path):
    from dpr.eval.ranking import results_metrics
    from dpr.rerank.rerank_file import rerank_file
    from dpr.rerank.runs import choose_weight, reranked

    recs = _qa_results(tmp_path / "dev.json")
    for rec in recs:  # the answer at the first stage's rank 2, inside k
        rec["ctxs"][1]["text"] += f" answer{rec['answers'][0][-1]}"
    write_results(tmp_path / "dev.json", recs)
    grid = [0.0, 0.5, 4.0]
    stats = rerank_file(ce_dir, tmp_path / "dev.json", tmp_path / "out.json", k=4, precision="fp32", weight_grid=grid)
    logits = _logits(ce_dir, recs, 4)
    by_w = {w: results_metrics([{**r, "ctxs": r["ctxs"][:4]} for r in reranked(recs, logits, 4, w)], max_k=4)
            for w in grid}
    assert stats["weight"] == choose_weight(by_w, "mrr")
    assert {w: m["mrr"] for w, m in stats["by_weight"].items()} == pytest.approx(
        {str(w): m["mrr"] for w, m in by_w.items()})
    expected = reranked(recs, logits, 4, stats["weight"])
    assert [[c["id"] for c in r["ctxs"]] for r in read_results(tmp_path / "out.json")] == [
        [c["id"] for c in r["ctxs"]] for r in expected]


def test_a_trec_run_is_reranked_with_the_datasets_texts_and_scored_by_qrels(ce_dir, tmp_path):
    from dpr.data.passages import PassageLookup
    from dpr.rerank.rerank_file import rerank_file

    (tmp_path / "passages.tsv").write_text("id\ttext\ttitle\n" + "".join(
        f"d{j}\tpassage number {j} about {'cats' if j % 2 else 'dogs'}\tT{j}\n" for j in range(6)), encoding="utf-8")
    passages, queries = PassageLookup.from_file(tmp_path / "passages.tsv"), {"q1": "cats?", "q2": "dogs?"}
    write_trec_run(tmp_path / "dev.trec", {"q1": {f"d{j}": 6.0 - j for j in range(6)},
                                           "q2": {f"d{j}": 1.0 + j for j in range(6)}}, tag="bm25")
    qrels = {"q1": {"d1": 2, "d3": 1}, "q2": {"d0": 1}}
    stats = rerank_file(ce_dir, tmp_path / "dev.trec", tmp_path / "out" / "dev.trec", k=3, precision="fp32",
                        weight_grid=[0.0, 1.0], queries=queries, passages=passages, qrels=qrels)
    assert stats["metric"] == "ndcg@10" and set(stats["before"]) == {"ndcg@10", "mrr@10", "recall@10"}
    run = read_trec_run(tmp_path / "out" / "dev.trec")
    records = read_results(tmp_path / "out" / "dev.json")  # the JSON beside the TREC run, in the same order
    assert [list(r["ctxs"][j]["id"] for j in range(6)) for r in records] == [
        sorted(run[r["query_id"]], key=lambda d: -run[r["query_id"]][d]) for r in records]
    assert [c["id"] for c in records[1]["ctxs"][3:]] == ["d2", "d1", "d0"]  # q2's tail, as BM25 ranked it
    with pytest.raises(ValueError, match="needs the query texts"):
        rerank_file(ce_dir, tmp_path / "dev.trec", tmp_path / "x.trec", k=3)
    with pytest.raises(ValueError, match="weight_grid needs answers"):
        rerank_file(ce_dir, tmp_path / "dev.trec", tmp_path / "x.trec", k=3, weight_grid=[0.0],
                    queries=queries, passages=passages)
    assert not (tmp_path / "x.trec").exists() and not (tmp_path / "x.json").exists()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_command(["dpr-rerank", "score", *args], cwd=cwd)  # the console script's main, in-process


def test_cli_reranks_a_trec_run_of_a_dataset_and_refuses_bad_values_in_one_line(ce_dir, tmp_path):
    ds = tmp_path / "data" / "beirlike"
    ds.mkdir(parents=True)
    (ds / "passages.tsv").write_text("id\ttext\ttitle\nd1\tcats purr\tCats\nd2\tdogs bark\tDogs\n", encoding="utf-8")
    (ds / "queries.jsonl").write_text('{"_id": "q1", "text": "do cats purr"}\n', encoding="utf-8")
    (ds / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n", encoding="utf-8")
    write_trec_run(tmp_path / "run.trec", {"q1": {"d1": 1.0, "d2": 2.0}})
    base = [f"model={ce_dir}", f"results={tmp_path / 'run.trec'}", "data.name=beirlike", f"data_dir={tmp_path / 'data'}",
            "rerank.score.precision=fp32", "rerank.score.k=2"]
    proc = _cli(*base, f"output={tmp_path / 'out.trec'}", f"qrels={ds / 'qrels.tsv'}", "weight=0.5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1].split(" ", 2)[2])
    assert stats["weight"] == 0.5 and stats["before"]["mrr@10"] == 0.5 and set(read_trec_run(tmp_path / "out.trec")["q1"]) == {"d1", "d2"}
    for arg, key in (("weight=-1", "weight"), ("weight_grid=[0,-0.5]", "weight_grid")):
        proc = _cli(*base, f"output={tmp_path / 'bad.trec'}", arg, cwd=tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and key in lines[0], proc.stderr
    proc = _cli(*base[:2], "data.name=missing", f"data_dir={tmp_path / 'data'}", f"output={tmp_path / 'bad.trec'}",
                cwd=tmp_path)
    assert proc.returncode == 2 and "queries.jsonl" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = _cli(f"model={ce_dir}", f"results={tmp_path / 'none.trec'}", f"output={tmp_path / 'bad.trec'}", cwd=tmp_path)
    assert proc.returncode == 2 and "no such results file" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "bad.trec").exists()
