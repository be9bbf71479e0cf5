"""Round trips of every on-disk format: what a writer writes, the reader gives back unchanged."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dpr.data.beir import iter_beir_corpus, read_qrels, read_queries, write_beir_corpus, write_qrels, write_queries
from dpr.data.dataset import DatasetPaths
from dpr.data.nq_open import read_nq_open, write_nq_open
from dpr.data.passages import PassageLookup, iter_passages, load_passages, passage_index, write_passages
from dpr.data.qa import QAPair, read_qa_tsv, write_qa_tsv
from dpr.data.results import read_results, read_trec_run, write_results, write_trec_run
from dpr.data.retriever_json import read_retriever_json, write_retriever_json
from dpr.data.sciq import read_sciq, write_sciq
from dpr.data.squad import read_squad, write_squad

# Texts that break naive CSV parsing: inner quotes, a text that is itself wrapped in quotes, a lone quote.
TRICKY = [
    {"id": "1", "text": 'He said "hi" and left.', "title": "Quote"},
    {"id": "2", "text": '"Fully quoted text"', "title": '"T"'},
    {"id": "3", "text": 'A lone " quote', "title": ""},
    {"id": "4", "text": '""', "title": "Empty quotes"},
    {"id": "x-5", "text": "Ünïcödé – ✓ 漢字", "title": "Ωmega"},
]


def test_passages_round_trip(tmp_path):
    path = tmp_path / "p.tsv"
    assert write_passages(path, TRICKY) == len(TRICKY)
    assert list(iter_passages(path)) == TRICKY
    assert path.read_text(encoding="utf-8").startswith("id\ttext\ttitle\n")


def test_passages_tab_and_newline_become_space(tmp_path):
    path = tmp_path / "p.tsv"
    write_passages(path, [("a", "one\ttwo\nthree\r\nfour", "ti\ttle")])
    assert list(iter_passages(path)) == [{"id": "a", "text": "one two three  four", "title": "ti tle"}]


def test_passages_reads_dpr_csv_quoting_and_crlf(tmp_path):
    # DPR's psgs_w100.tsv was written by Python's csv module: quoted fields with doubled inner quotes.
    path = tmp_path / "psgs.tsv"
    path.write_bytes(b'id\ttext\ttitle\r\n1\t"Aaron ( or ; ""Aharon"") is a prophet"\tAaron\r\n')
    assert list(iter_passages(path)) == [{"id": "1", "text": 'Aaron ( or ; "Aharon") is a prophet', "title": "Aaron"}]


def test_load_passages_arrow_and_lookup(tmp_path):
    path = tmp_path / "p.tsv"
    write_passages(path, TRICKY)
    cache = tmp_path / "cache"
    ds = load_passages(path, cache_dir=cache)
    assert ds.column_names == ["id", "text", "title"]
    assert ds.cache_files, "expected an on-disk (memory-mapped) Arrow table"
    assert [dict(r) for r in ds] == TRICKY
    assert passage_index(ds)["x-5"] == 4
    lookup = PassageLookup(ds)
    assert lookup["2"]["text"] == '"Fully quoted text"' and "nope" not in lookup and len(lookup) == 5
    # editing the file must not serve the stale cache
    write_passages(path, TRICKY[:2])
    os.utime(path, ns=(1, 1))
    assert len(load_passages(path, cache_dir=cache)) == 2


def test_qa_round_trip_and_dpr_literal_style(tmp_path):
    pairs = [QAPair("who wrote \"it\"?", ["Stephen King", "King"]), QAPair("tab\tin question", ['a "b"', "c\td"])]
    path = tmp_path / "x.qa.tsv"
    write_qa_tsv(path, pairs)
    back = read_qa_tsv(path)
    assert back == [pairs[0], QAPair("tab in question", ['a "b"', "c\td"])]
    # DPR's nq-test.qa.csv style: a Python literal list, CRLF endings
    dpr_style = tmp_path / "nq-test.qa.csv"
    dpr_style.write_bytes("who got the first nobel prize in physics\t['Wilhelm Conrad Röntgen', \"O'Neil\"]\r\n".encode())
    assert read_qa_tsv(dpr_style) == [QAPair("who got the first nobel prize in physics", ["Wilhelm Conrad Röntgen", "O'Neil"])]
    # ... and when Python's csv module had quoted the list field
    quoted = tmp_path / "quoted.qa.csv"
    quoted.write_text('q\t"[\'a\', ""b""]"\n', encoding="utf-8")
    assert read_qa_tsv(quoted) == [QAPair("q", ["a", "b"])]


def _example(i: int) -> dict:
    ctx = {"passage_id": f"p{i}", "title": "T", "text": f"text {i}"}
    return {
        "question": f"q{i}",
        "answers": [f"a{i}"],
        "positive_ctxs": [dict(ctx, score=1.5, has_answer=True)],
        "negative_ctxs": [],
        "hard_negative_ctxs": [dict(ctx, passage_id="h")],
    }


def test_retriever_json_round_trip(tmp_path):
    path = tmp_path / "train.json"
    examples = [_example(i) for i in range(3)]
    assert write_retriever_json(path, iter(examples)) == 3
    assert read_retriever_json(path) == examples
    assert json.loads(path.read_text()) == examples  # plain JSON, readable by DPR itself


def test_retriever_json_tolerates_missing_negatives_and_int_ids(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"question": "q", "answers": [], "positive_ctxs": [{"passage_id": 7, "title": "", "text": "t"}]}]))
    (ex,) = read_retriever_json(path)
    assert ex["positive_ctxs"][0]["passage_id"] == "7" and ex["negative_ctxs"] == [] and ex["hard_negative_ctxs"] == []


def test_beir_round_trip_crlf(tmp_path):
    docs = [{"id": "d1", "text": "text one", "title": "T1"}, {"id": "d2", "text": "", "title": "only a title"}]
    write_beir_corpus(tmp_path / "corpus.jsonl", docs)
    assert list(iter_beir_corpus(tmp_path / "corpus.jsonl")) == docs
    queries = {"q1": "first query", "q2": "second"}
    write_queries(tmp_path / "queries.jsonl", queries)
    assert read_queries(tmp_path / "queries.jsonl") == queries
    qrels = {"q1": {"d1": 1, "d2": 2}, "q2": {"d2": 1}}
    write_qrels(tmp_path / "qrels.tsv", qrels)
    assert read_qrels(tmp_path / "qrels.tsv", query_ids=queries, doc_ids={"d1", "d2"}) == qrels
    crlf = tmp_path / "crlf.tsv"
    crlf.write_bytes(b"query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\nq1\td2\t2\r\nq2\td2\t1\r\n")
    assert read_qrels(crlf) == qrels


def test_results_round_trip(tmp_path):
    results = [
        {"question": "q", "answers": ["a"], "qid": "7", "ctxs": [
            {"id": "p1", "title": "T", "text": "x", "score": 3.25, "has_answer": True},
            {"id": "p2", "title": "", "text": "y", "score": -1.0, "has_answer": False},
        ]},
        {"question": "q2", "answers": [], "ctxs": []},
    ]
    path = tmp_path / "results.json"
    write_results(path, results)
    assert read_results(path) == results


def test_trec_run_round_trip(tmp_path):
    run = {"q1": {"d1": 2.5, "d2": 7.0, "d3": 2.5}, "q2": {"d9": -0.125}}
    path = tmp_path / "run.trec"
    assert write_trec_run(path, run, tag="bm25") == 4
    assert read_trec_run(path) == run
    lines = path.read_text().splitlines()
    assert lines[0].split() == ["q1", "Q0", "d2", "1", "7.0", "bm25"]  # highest score ranks first
    assert [line.split()[2] for line in lines[:3]] == ["d2", "d1", "d3"]  # ties broken by docid


def test_squad_sciq_nq_round_trip(tmp_path):
    articles = [{"title": "A_b", "paragraphs": [{"context": "Paris is in France.", "qas": [
        {"id": "1", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}]}]}]}]
    write_squad(tmp_path / "s.json", articles)
    assert read_squad(tmp_path / "s.json") == articles
    sciq = [{"question": "q?", "correct_answer": "a", "distractor1": "b", "distractor2": "c", "distractor3": "d", "support": ""}]
    write_sciq(tmp_path / "sciq.json", sciq)
    assert read_sciq(tmp_path / "sciq.json") == sciq
    pairs = [QAPair("when?", ["1972", "December 1972"])]
    write_nq_open(tmp_path / "nq.jsonl", pairs)
    assert read_nq_open(tmp_path / "nq.jsonl") == pairs


def test_dataset_paths(tiny_data_dir: Path):
    paths = DatasetPaths.of(tiny_data_dir, "tiny")
    assert paths.kind == "qa" and paths.passages.is_file() and paths.train.is_file() and paths.test_qa.is_file()
    assert len(read_qa_tsv(paths.test_qa)) == 8 and len(read_retriever_json(paths.dev)) == 4
    assert len(list(iter_passages(paths.passages))) == 8
    assert paths.qrels("test") == tiny_data_dir / "tiny" / "qrels" / "test.tsv"


def test_writers_are_atomic(tmp_path):
    path = tmp_path / "p.tsv"
    write_passages(path, TRICKY)
    before = path.read_bytes()

    def rows():
        yield TRICKY[0]
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_passages(path, rows())
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.tsv"]
