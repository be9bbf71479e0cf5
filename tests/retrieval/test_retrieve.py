"""Dense retrieval end to end through the console scripts (encode → index → retrieve), BEIR runs, hybrid CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpr.data.beir import write_qrels, write_queries
from dpr.data.results import read_results, read_trec_run, write_results
from dpr.errors import DataError
from dpr.index.shards import list_shards, write_shard
from dpr.retrieval.passages import fetch_passages
from dpr.retrieval.runs import dense_retrieve, hybrid_retrieve

from tests.conftest import TINY_PASSAGES, TINY_QA
from tests.run_command import run_command

BIN = Path(sys.executable).parent


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return run_command(cmd, cwd=cwd)  # the console script's main, in-process


@pytest.fixture(scope="module")
def built(tiny_model_dir, tmp_path_factory):
    """encode → index through the console scripts, once for the module."""
    from tests.conftest import write_tiny_dataset

    root = tmp_path_factory.mktemp("e2e")
    data = write_tiny_dataset(root / "data" / "tiny")
    emb, index = root / "emb", root / "idx" / "index.faiss"
    enc = run(["dpr-encode", f"model={tiny_model_dir}", f"passages={data / 'passages.tsv'}", f"output_dir={emb}",
               "num_shards=2", "dtype=float32", "autocast=off", "batch_size=3"], cwd=root)
    assert enc.returncode == 0, enc.stderr
    idx = run(["dpr-index", f"embeddings={emb}", f"output={index}", "index=flat"], cwd=root)
    assert idx.returncode == 0, idx.stderr
    assert "8 passages" in idx.stdout and "bytes/passage" in idx.stdout
    return root, data, emb, index


def test_dense_retrieval_cli_end_to_end(built, tiny_model_dir):
    root, data, emb, index = built
    out = root / "results" / "test.json"
    proc = run(["dpr-retrieve", f"model={tiny_model_dir}", f"index={index}", f"passages={data / 'passages.tsv'}",
                f"qa={data / 'test.qa.tsv'}", f"output={out}", "k=8", "autocast=off"], cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in root.iterdir()) == ["data", "emb", "idx", "results"]  # nothing else in cwd
    results = read_results(out)  # validates the DPR results schema
    assert [r["question"] for r in results] == [q for q, _, _ in TINY_QA]
    text_of = {pid: (text, title) for pid, text, title in TINY_PASSAGES}
    for res, (_, answers, gold) in zip(results, TINY_QA):
        assert res["answers"] == answers
        assert sorted(c["id"] for c in res["ctxs"]) == sorted(text_of)  # k=8: the whole corpus, once each
        scores = [c["score"] for c in res["ctxs"]]
        assert scores == sorted(scores, reverse=True)
        for c in res["ctxs"]:
            assert (c["text"], c["title"]) == text_of[c["id"]]
            # each tiny answer occurs in its own passage only
            assert c["has_answer"] is (c["id"] == gold), (res["question"], c["id"])

    # the scores are the model's: question vectors · the exported passage vectors
    from dpr.models import encode_texts, load_biencoder

    model, tok = load_biencoder(str(tiny_model_dir))
    q = encode_texts(model, tok, [q for q, _, _ in TINY_QA], "question", autocast="off").numpy()
    shards = list_shards(emb)
    p = np.concatenate([np.asarray(s.vectors()) for s in shards])
    pids = [pid for s in shards for pid in s.ids()]
    sims = q @ p.T
    col = {pid: j for j, pid in enumerate(pids)}
    for i, res in enumerate(results):
        # every passage carries its own score (a random model scores near-ties, so compare scores, not orders)
        np.testing.assert_allclose([c["score"] for c in res["ctxs"]], [sims[i, col[c["id"]]] for c in res["ctxs"]],
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose([c["score"] for c in res["ctxs"]], np.sort(sims[i])[::-1], rtol=1e-4, atol=1e-4)


def test_beir_queries_write_a_trec_run(built, tiny_model_dir, tmp_path):
    _, data, _, index = built
    queries = tmp_path / "queries.jsonl"
    write_queries(queries, {"q1": "capital of france", "q2": "highest mountain", "q3": "boiling water"})
    qrels = tmp_path / "qrels" / "test.tsv"
    write_qrels(qrels, {"q1": {"p2": 1}, "q3": {"p7": 1}})
    out = tmp_path / "dense.trec"
    run_ = dense_retrieve(tiny_model_dir, index, queries_path=queries, qrels_path=qrels, output=out, k=3,
                          autocast="off")
    assert list(run_) == ["q1", "q3"]  # only the split's judged queries, in file order
    assert all(len(docs) == 3 for docs in run_.values())
    assert read_trec_run(out) == run_
    with pytest.raises(ValueError, match="exactly one"):
        dense_retrieve(tiny_model_dir, index, data / "passages.tsv", data / "test.qa.tsv", queries_path=queries)


def test_retrieve_split_of_a_prepared_dataset(built, tiny_model_dir, tmp_path):
    from dpr.data.dataset import DatasetPaths
    from dpr.retrieval import Retriever
    from dpr.retrieval.runs import retrieve_split

    _, data, _, index = built
    ds = DatasetPaths(data)
    dense = Retriever.dense(tiny_model_dir, index, ds.passages, autocast="off")
    test = read_results(retrieve_split(dense, ds, "test", tmp_path / "test.json", k=2))
    assert len(test) == len(TINY_QA) and all(len(r["ctxs"]) == 2 for r in test)
    dev = read_results(retrieve_split(dense, ds, "dev", tmp_path / "dev.json", k=2))
    assert [r["question"] for r in dev] == [q for q, _, _ in TINY_QA[:4]]  # from dev.json (no dev.qa.tsv)


def test_index_from_another_model_or_corpus_is_refused(built, tiny_model_dir, tmp_path):
    _, data, _, _ = built
    rng = np.random.default_rng(0)
    write_shard(tmp_path / "emb16", 0, 1, rng.standard_normal((3, 16)).astype(np.float32), ["p1", "p2", "zz"])
    from dpr.index import build_and_save

    build_and_save(tmp_path / "emb16", tmp_path / "i16.faiss")
    with pytest.raises(DataError, match="16-dim"):  # refused before the model is even loaded
        dense_retrieve(tiny_model_dir, tmp_path / "i16.faiss", data / "passages.tsv", data / "test.qa.tsv")
    assert set(fetch_passages(data / "passages.tsv", ["p2", "p1", "p2"])) == {"p1", "p2"}
    with pytest.raises(DataError, match="'zz'"):
        fetch_passages(data / "passages.tsv", ["p1", "zz"])


def test_hybrid_cli_and_errors(built, tmp_path):
    root, data, _, index = built
    # a hand-made "BM25" that ranks the gold passage first for every question, and a dense list that misses it
    def ctx(pid, score, hit):
        return {"id": pid, "title": "t", "text": "x", "score": score, "has_answer": hit}

    bm25 = [{"question": q, "answers": a, "ctxs": [ctx(g, 20.0, True), ctx("p8" if g != "p8" else "p1", 5.0, False)]}
            for q, a, g in TINY_QA]
    dense = [{"question": q, "answers": a, "ctxs": [ctx("p5" if g != "p5" else "p6", 0.9, False), ctx(g, 0.1, True)]}
             for q, a, g in TINY_QA]
    write_results(tmp_path / "bm25.json", bm25)
    write_results(tmp_path / "dense.json", dense)
    out = tmp_path / "hybrid.json"
    proc = run(["dpr-retrieve", "mode=hybrid", f"bm25={tmp_path / 'bm25.json'}", f"dense={tmp_path / 'dense.json'}",
                f"bm25_dev={tmp_path / 'bm25.json'}", f"dense_dev={tmp_path / 'dense.json'}", f"output={out}",
                "metric_k=1"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # gold: dense 0 + w·1, other: dense 1 + w·0 → gold first iff w > 1 (tie at 1 → dense's first); the default
    # grid (HybridConfig's, the pipeline's) has 1.5 next after 1.0
    assert '"weight": 1.5' in proc.stdout
    fused = read_results(out)
    assert all(r["ctxs"][0]["has_answer"] for r in fused)
    info = hybrid_retrieve(tmp_path / "bm25.json", tmp_path / "dense.json", tmp_path / "rrf.json", fusion="rrf")
    assert info["fusion"] == "rrf" and len(read_results(tmp_path / "rrf.json")) == len(TINY_QA)
    with pytest.raises(ValueError, match="weight"):
        hybrid_retrieve(tmp_path / "bm25.json", tmp_path / "dense.json", tmp_path / "x.json")

    missing = run(["dpr-retrieve", "model=whatever", f"index={tmp_path / 'none.faiss'}",
                   f"passages={data / 'passages.tsv'}", f"qa={data / 'test.qa.tsv'}", f"output={tmp_path / 'o.json'}"],
                  cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith("dpr-retrieve: error:") and "none.faiss" in missing.stderr
    assert missing.stderr.strip().count("\n") == 0
