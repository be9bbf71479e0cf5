"""BM25 (bm25s): index/search/save/load, cached index, results files, hard-negative mining, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpr import bm25
from dpr.bm25 import index as bm25_index
from dpr.data.beir import write_qrels, write_queries
from dpr.data.dataset import DatasetPaths
from dpr.data.passages import iter_passages, write_passages
from dpr.data.results import read_results, read_trec_run
from dpr.data.retriever_json import read_retriever_json, write_retriever_json
from dpr.errors import DataError
from dpr.eval.has_answer import has_answer
from dpr.negatives import bm25 as mine
from dpr.retrieval import BM25Retriever
from dpr.retrieval.records import iter_qa_records
from dpr.retrieval.runs import retrieve_split
from tests.run_command import run_command

BIN = Path(sys.executable).parent
ENV = {**os.environ, "WANDB_MODE": "disabled"}


@pytest.fixture()
def tiny(tiny_data_dir) -> DatasetPaths:
    return DatasetPaths(tiny_data_dir / "tiny")


def test_search_ranks_the_matching_passage_first(tiny):
    index = bm25.build_index(tiny.passages)
    assert len(index) == 8 and index.params["k1"] == 0.9 and index.params["b"] == 0.4
    ids, scores = bm25.search(index, ["what is the capital of hawaii", "where does water boil"], k=3)
    assert ids[0][0] == "p1" and ids[1][0] == "p7"
    assert np.all(np.diff(scores, axis=1) <= 0)
    ids, scores = bm25.search(index, ["capital"], k=50)  # k above the corpus size is clamped
    assert len(ids[0]) == 8 and set(ids[0][:3]) == {"p1", "p2", "p8"}


def test_stemming_matches_inflections(tiny):
    stemmed = bm25.build_index(tiny.passages, stemmer="english")
    plain = bm25.build_index(tiny.passages, stemmer=None)
    _, s_stem = bm25.search(stemmed, ["converting"], k=1)  # p5 says "converts"
    _, s_plain = bm25.search(plain, ["converting"], k=1)
    assert s_stem[0, 0] > 0 and s_plain[0, 0] == 0


def _raw_bm25s(texts, queries, k):
    """bm25s called directly, with the same tokenization settings."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    retriever = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    retriever.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
    q = bm25s.tokenize(queries, stopwords="en", stemmer=stemmer, show_progress=False)
    return retriever.retrieve(q, k=k, show_progress=False)


def test_scores_equal_raw_bm25s(tiny):
    rows = list(iter_passages(tiny.passages))
    index = bm25.build_index(tiny.passages)
    queries = ["what is the capital of hawaii", "highest mountain on earth", "largest ocean"]
    _, ours = bm25.search(index, queries, k=5)
    _, raw = _raw_bm25s([bm25_index.passage_text(r) for r in rows], queries, 5)
    np.testing.assert_allclose(ours, raw, rtol=1e-6)


def _bm25s_own_index(rows, stopwords="en", stemmer="english"):
    """bm25s' own index() on the same token ids (the reference for our numpy weights)."""
    import bm25s

    tok = bm25_index.make_tokenizer(stopwords, stemmer)
    ids = list(tok.streaming_tokenize((bm25_index.passage_text(r) for r in rows), update_vocab=True))
    retriever = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    retriever.index((ids, tok.get_vocab_dict()), show_progress=False)
    return retriever.scores


def _assert_same_weights(ours, ref):
    assert ours["num_docs"] == ref["num_docs"]
    for key in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(ours[key], ref[key], err_msg=key)


@pytest.mark.parametrize("chunk_tokens", [1 << 25, 7])
def test_weights_bit_identical_to_bm25s_index(tiny, monkeypatch, chunk_tokens):
    from dpr.bm25 import weights

    monkeypatch.setattr(weights, "_CHUNK_TOKENS", chunk_tokens)  # 7: many chunks, merged by term
    rows = list(iter_passages(tiny.passages))
    for stopwords, stemmer in (("en", "english"), (None, None)):
        ours = bm25.build_index(tiny.passages, stopwords=stopwords, stemmer=stemmer).retriever.scores
        _assert_same_weights(ours, _bm25s_own_index(rows, stopwords, stemmer))


@pytest.mark.slow
def test_weights_bit_identical_on_real_corpus(mirror_dir):
    from dpr.data.beir import iter_beir_corpus

    rows = list(iter_beir_corpus(mirror_dir / "nfcorpus" / "corpus.jsonl"))
    _assert_same_weights(bm25.build_index_from_rows(rows).retriever.scores, _bm25s_own_index(rows))


def test_save_load_roundtrip(tiny, tmp_path):
    index = bm25.build_index(tiny.passages, stopwords=None)
    bm25.save_index(index, tmp_path / "idx")
    loaded = bm25.load_index(tmp_path / "idx")
    assert loaded.ids == index.ids and loaded.params == index.params
    queries = ["capital of france", "powerhouse of the cell", "nothing matches zzz"]
    a_ids, a_scores = bm25.search(index, queries, k=4)
    b_ids, b_scores = bm25.search(loaded, queries, k=4)
    assert a_ids == b_ids
    np.testing.assert_array_equal(a_scores, b_scores)


def test_index_cache_reused_and_invalidated(tiny, tmp_path, monkeypatch):
    idx_dir = tmp_path / "cache"
    first = bm25.get_or_build_index(tiny.passages, idx_dir)

    def no_build(*a, **k):
        raise AssertionError("rebuilt although the cache is up to date")

    monkeypatch.setattr(bm25_index, "build_index", no_build)
    again = bm25.get_or_build_index(tiny.passages, idx_dir)
    assert again.ids == first.ids and again.meta["key"] == first.meta["key"]
    monkeypatch.undo()

    changed = bm25.get_or_build_index(tiny.passages, idx_dir, k1=1.2)
    assert changed.meta["key"] != first.meta["key"] and changed.params["k1"] == 1.2
    rows = list(iter_passages(tiny.passages))
    write_passages(tiny.passages, rows + [{"id": "p9", "text": "Tokyo is the capital of Japan.", "title": "Tokyo"}])
    grown = bm25.get_or_build_index(tiny.passages, idx_dir, k1=1.2)
    assert len(grown) == 9


def test_stale_index_refused(tiny, tmp_path):
    index = bm25.build_index(tiny.passages)
    rows = list(iter_passages(tiny.passages))
    write_passages(tiny.passages, list(reversed(rows)))
    with pytest.raises(DataError, match="stale"):
        list(iter_qa_records(BM25Retriever(index, tiny.passages), [("capital of hawaii", ["Honolulu"])], k=3))


def test_retrieve_split_qa_results(tiny, tmp_path):
    index = bm25.build_index(tiny.passages)
    results = read_results(retrieve_split(BM25Retriever(index, tiny.passages), tiny, "test", tmp_path / "test.json",
                                          k=3))
    assert len(results) == 8
    first = results[0]
    assert first["question"] == "what is the capital of hawaii" and first["answers"] == ["Honolulu"]
    assert [c["id"] for c in first["ctxs"]][0] == "p1" and len(first["ctxs"]) == 3
    assert first["ctxs"][0]["has_answer"] is True and first["ctxs"][0]["title"] == "Honolulu"
    for r in results:
        for c in r["ctxs"]:
            assert c["has_answer"] == has_answer(r["answers"], c["text"])


def _add_answer_bearing_passages(ds: DatasetPaths) -> None:
    rows = list(iter_passages(ds.passages))
    rows += [
        {"id": "x1", "text": "The capital of Hawaii, Honolulu, has a harbour.", "title": "Harbour"},
        {"id": "x2", "text": "Paris hosts many capital city museums.", "title": "Museums"},
        {"id": "x3", "text": "The largest ocean basin on Earth.", "title": "Pacific"},  # answer in the title only
    ]
    write_passages(ds.passages, rows)


def test_mining_never_returns_positives_or_answers(tiny):
    _add_answer_bearing_passages(tiny)
    index = bm25.build_index(tiny.passages)
    examples = read_retriever_json(tiny.train)
    mined, stats = mine.mine_hard_negatives(index, examples, tiny.passages, num_negatives=5, depth=11)
    assert len(mined) == len(examples)
    for ex in mined:
        positives = {c["passage_id"] for c in ex["positive_ctxs"]}
        negs = ex["hard_negative_ctxs"]
        # only passages sharing a term with the question (score > 0) qualify: some get none here
        assert len(negs) <= 5
        assert len({c["passage_id"] for c in negs}) == len(negs)
        for c in negs:
            assert c["passage_id"] not in positives
            assert not has_answer(ex["answers"], c["text"]) and not has_answer(ex["answers"], c["title"])
            assert c["score"] > 0
    assert stats["rejected_answer"] >= 3  # x1 (Hawaii), x2 (France), x3 (ocean, title)
    assert stats["rejected_positive"] == len(examples)
    assert stats["examined"] == stats["kept"] + stats["rejected_positive"] + stats["rejected_answer"]
    assert stats["kept"] == sum(len(ex["hard_negative_ctxs"]) for ex in mined) >= len(examples)


def test_mine_dataset_writes_back_and_marks_up_to_date(tiny):
    index = bm25.get_or_build_index(tiny.passages, tiny.root / "bm25_index")
    stats = mine.mine_dataset(index, tiny, num_negatives=2, depth=8)
    assert set(stats) == {"train", "dev"}
    train = read_retriever_json(tiny.train)
    assert all(len(ex["hard_negative_ctxs"]) <= 2 for ex in train)
    assert sum(len(ex["hard_negative_ctxs"]) for ex in train) == stats["train"]["kept"] > 0
    assert mine.mining_up_to_date(tiny, index, num_negatives=2, depth=8)
    assert not mine.mining_up_to_date(tiny, index, num_negatives=3, depth=8)
    mine.mine_dataset(index, tiny, num_negatives=2, depth=8, force=True)  # replaces, never appends
    assert read_retriever_json(tiny.train) == train


def test_mining_qrels_excludes_judged_documents(tmp_path):
    root = tmp_path / "q"
    docs = [("d1", "vitamin d and bone health"), ("d2", "vitamin d deficiency in winter"),
            ("d3", "vitamin c and colds"), ("d4", "bone density in older adults"), ("d5", "winter sports")]
    write_passages(root / "passages.tsv", [{"id": i, "text": t, "title": ""} for i, t in docs])
    write_queries(root / "queries.jsonl", {"Q1": "vitamin d bone", "Q2": "winter"})
    write_qrels(root / "qrels" / "train.tsv", {"Q1": {"d1": 1}, "Q2": {"d5": 1}})
    write_qrels(root / "qrels" / "dev.tsv", {"Q1": {"d2": 0, "d4": 2}})  # any judgement excludes
    ctx = {"passage_id": "d1", "title": "", "text": "vitamin d and bone health"}
    write_retriever_json(root / "train.json", [{"question": "vitamin d bone", "answers": [], "positive_ctxs": [ctx],
                                                "negative_ctxs": [], "hard_negative_ctxs": [], "query_id": "Q1"}])
    (root / "meta.json").write_text(json.dumps({"name": "q", "kind": "qrels"}))
    ds = DatasetPaths(root)
    index = bm25.build_index(ds.passages)
    stats = mine.mine_dataset(index, ds, num_negatives=5, depth=5)
    (ex,) = read_retriever_json(ds.train)
    assert [c["passage_id"] for c in ex["hard_negative_ctxs"]] == ["d3"]
    assert stats["train"]["rejected_judged"] == 2 and stats["train"]["rejected_positive"] == 1


@pytest.mark.slow
def test_mining_on_real_squad(mirror_dir):
    """SQuAD dev paragraphs as the corpus, 400 questions: no mined negative holds an answer."""
    from dpr.data.squad import read_squad

    articles = read_squad(mirror_dir / "squad-v1.1" / "dev-v1.1.json")
    rows, examples = [], []
    for a, art in enumerate(articles):
        for p, par in enumerate(art["paragraphs"]):
            pid = f"{a}_{p}"
            rows.append({"id": pid, "title": art["title"], "text": par["context"]})
            for qa in par["qas"][:1]:
                examples.append({"question": qa["question"], "answers": [x["text"] for x in qa["answers"]],
                                 "positive_ctxs": [{"passage_id": pid, "title": art["title"], "text": par["context"]}]})
    index = bm25.build_index_from_rows(rows, total=len(rows))
    import datasets

    ds = datasets.Dataset.from_list(rows)
    mined, stats = mine.mine_hard_negatives(index, examples[::5][:400], ds, num_negatives=10, depth=50)
    for ex in mined:
        pos = ex["positive_ctxs"][0]["passage_id"]
        for c in ex["hard_negative_ctxs"]:
            assert c["passage_id"] != pos and not has_answer(ex["answers"], c["text"])
    assert stats["rejected_answer"] > 0 and stats["rejected_positive"] > 300
    assert stats["kept"] > 0.9 * 10 * 400


def _run(args, cwd):
    return run_command(["dpr-bm25", *args], cwd=cwd)  # the console script's main, in-process


def test_cli_bm25_dataset_mine_and_eval(tiny_data_dir, tmp_path):
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    work = tmp_path / "work"
    work.mkdir()
    common = [f"data_dir={tiny_data_dir}", f"hydra.searchpath=[file://{conf}]"]
    out = tmp_path / "bm25_test.json"
    proc = _run(["data=tiny", "split=test", f"output={out}", "k=5", *common], work)
    assert proc.returncode == 0, proc.stderr
    results = read_results(out)
    assert len(results) == 8 and all(len(r["ctxs"]) == 5 for r in results)
    assert (tiny_data_dir / "tiny" / "bm25_index" / "dpr_bm25.json").is_file()

    proc = _run(["data=tiny", "mine=true", "num_negatives=3", *common], work)
    assert proc.returncode == 0, proc.stderr
    train = read_retriever_json(tiny_data_dir / "tiny" / "train.json")
    assert all(len(ex["hard_negative_ctxs"]) <= 3 for ex in train)
    assert sum(len(ex["hard_negative_ctxs"]) for ex in train) >= 5

    proc = subprocess.run([str(BIN / "dpr-eval"), f"results=[{out}]", f"output_dir={tmp_path / 'ev'}"],
                          cwd=work, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert report["num_questions"] == 8 and report["systems"]["bm25_test"]["top_k"]["5"] == 1.0
    assert list(work.iterdir()) == []  # nothing written into the working directory


def test_cli_bm25_standalone(tiny_data_dir, tmp_path):
    root = tiny_data_dir / "tiny"
    out = tmp_path / "standalone.json"
    proc = _run([f"passages={root / 'passages.tsv'}", f"qa={root / 'test.qa.tsv'}", f"output={out}", "k=2"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [r["ctxs"][0]["id"] for r in read_results(out)][:2] == ["p1", "p2"]

    write_queries(tmp_path / "queries.jsonl", {"a": "capital of germany", "b": "highest mountain", "c": "unjudged"})
    write_qrels(tmp_path / "qrels.tsv", {"a": {"p8": 1}, "b": {"p4": 1}})
    run_path = tmp_path / "run.trec"
    proc = _run([f"passages={root / 'passages.tsv'}", f"queries={tmp_path / 'queries.jsonl'}",
                 f"qrels={tmp_path / 'qrels.tsv'}", f"output={run_path}", "k=3"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = read_trec_run(run_path)
    assert set(run) == {"a", "b"} and max(run["a"], key=run["a"].get) == "p8"


def test_cli_bm25_errors_are_one_line(tmp_path):
    proc = _run(["data=squad1_open", f"data_dir={tmp_path}", f"output={tmp_path / 'x.json'}"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("dpr-bm25: error:") and proc.stderr.strip().count("\n") == 0
    bad = tmp_path / "bad.tsv"
    bad.write_text("id\ttext\ttitle\np1\tsome text\tT\np1\tother text\tT\n")
    proc = _run([f"passages={bad}", f"qa={bad}", f"output={tmp_path / 'y.json'}"], tmp_path)
    assert proc.returncode == 2 and "bad.tsv:3" in proc.stderr and "duplicate" in proc.stderr
