"""Peer formats in and out: ``dpr-data data=import`` (Tevatron, FlagEmbedding, sentence-transformers,
MS MARCO triples) and ``dpr-data export``; every format round-trips, every malformed record is one line."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpr.data.beir import read_qrels, read_queries
from dpr.data.dataset import DatasetPaths
from dpr.data.formats.common import content_id
from dpr.data.formats.export import export_dataset
from dpr.data.formats.scores import FILE_NAME, read_teacher_scores
from dpr.data.passages import iter_passages
from dpr.data.prepare import prepare_dataset
from dpr.data.prepare.import_ import collect
from dpr.data.retriever_json import read_retriever_json
from dpr.errors import DataError
from tests.run_command import run_as_subprocess

BIN = Path(sys.executable).parent
TOPICS = ["cats", "dogs", "owls", "bees", "eels", "yaks", "emus", "rats", "cows", "ants"]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def tevatron_rows() -> list[dict]:
    rows = []
    for i, t in enumerate(TOPICS):
        nxt = TOPICS[(i + 1) % len(TOPICS)]
        rows.append({"query_id": str(100 + i), "query": f"what do {t} eat",
                     "positive_passages": [{"docid": f"d{i}", "title": t.title(), "text": f"{t} eat many things."}],
                     "negative_passages": [{"docid": f"d{(i + 1) % 10}", "title": nxt.title(), "text": f"{nxt} eat many things."},
                                           {"title": "", "text": f"a passage without an id about {t}\tand tabs"}]})
    return rows


def flag_rows() -> list[dict]:
    rows = []
    for i, t in enumerate(TOPICS):
        rows.append({"query": f"where do {t} live", "pos": [f"{t} live in nests."],
                     "neg": [f"{TOPICS[(i + 1) % 10]} live in nests.", "a shared negative passage"],
                     "pos_scores": [0.9 - i / 100], "neg_scores": [0.3, 0.1 + i / 100],
                     "prompt": "Represent this query: ", "type": "normal"})
    return rows


def st_table(with_scores: bool = True, k: int = 2) -> dict[str, list]:
    table: dict[str, list] = {"anchor": [], "positive": []}
    for j in range(1, k + 1):
        table[f"negative_{j}"] = []
    if with_scores:
        table["scores"] = []
    for i, t in enumerate(TOPICS):
        table["anchor"].append(f"how big are {t}")
        table["positive"].append(f"{t} are of some size.")
        for j in range(1, k + 1):
            table[f"negative_{j}"].append(f"{TOPICS[(i + j) % 10]} are of some size.")
        if with_scores:
            table["scores"].append([5.0 + i, *[float(j - i) for j in range(1, k + 1)]])
    return table


def write_st(path: Path, table: dict[str, list]) -> Path:
    cols = list(table)
    n = len(table[cols[0]])
    if path.suffix == ".parquet":
        import datasets

        datasets.Dataset.from_dict(table).to_parquet(str(path))
    elif path.suffix == ".csv":
        with open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for i in range(n):
                w.writerow([json.dumps(table[c][i]) if c == "scores" else table[c][i] for c in cols])
    else:
        _write_jsonl(path, [{c: table[c][i] for c in cols} for i in range(n)])
    return path


def triples_lines() -> list[str]:
    # each query on two lines (two negatives): MS MARCO repeats the query per triple
    out = []
    for i, t in enumerate(TOPICS):
        for j in (1, 2):
            out.append(f"why are {t} loud\t{t} are loud at night.\t{TOPICS[(i + j) % 10]} are loud at night.")
    return out


def make_source(tmp: Path, fmt: str) -> Path:
    if fmt == "tevatron":
        return _write_jsonl(tmp / "tev.jsonl", tevatron_rows())
    if fmt == "flagembedding":
        return _write_jsonl(tmp / "flag.jsonl", flag_rows())
    if fmt == "sentence_transformers":
        return write_st(tmp / "st.parquet", st_table())
    (tmp / "triples.tsv").write_text("\n".join(triples_lines()) + "\n", encoding="utf-8")
    return tmp / "triples.tsv"


def do_import(fmt: str, path: Path, data_dir: Path, name: str, **kw) -> DatasetPaths:
    return DatasetPaths(prepare_dataset({"name": name, "recipe": "import", "format": fmt, "path": str(path), **kw},
                                        data_dir))


def snapshot(ds: DatasetPaths) -> dict:
    """Everything an import produced that must survive a round trip."""
    return {"train": read_retriever_json(ds.train), "dev": read_retriever_json(ds.dev),
            "passages": sorted((p["id"], p["text"], p["title"]) for p in iter_passages(ds.passages)),
            "scores": read_teacher_scores(ds.root / FILE_NAME)}


FORMATS = ["tevatron", "flagembedding", "sentence_transformers", "triples"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_import_export_import_round_trips(tmp_path, fmt):
    src = make_source(tmp_path, fmt)
    a = do_import(fmt, src, tmp_path / "prep", "a")
    first = snapshot(a)
    assert len(first["train"]) + len(first["dev"]) == 10 and len(first["dev"]) == 1  # seeded 10% became dev
    assert all(ex["hard_negative_ctxs"] and ex["answers"] == [] for s in ("train", "dev") for ex in first[s])
    assert a.kind == "qrels" and a.read_meta()["recipe"] == "import"
    out = tmp_path / ("out.parquet" if fmt == "sentence_transformers" else "out.jsonl" if fmt != "triples" else "out.tsv")
    counts = export_dataset(a.root, fmt, out)
    assert counts["questions"] == 10
    b = do_import(fmt, out, tmp_path / "prep", "b")
    assert snapshot(b) == first


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_flagembedding_set_trains_in_sentence_transformers(tmp_path, suffix):
    # uneven negatives per question: exported as triplets (nothing lost), scores carried along
    rows = flag_rows()
    for i, row in enumerate(rows):
        row.pop("prompt")
        row["neg"], row["neg_scores"] = row["neg"][: 1 + i % 2], row["neg_scores"][: 1 + i % 2]
    a = do_import("flagembedding", _write_jsonl(tmp_path / "f.jsonl", rows), tmp_path / "prep", "a")
    counts = export_dataset(a.root, "sentence_transformers", tmp_path / f"st{suffix}")
    assert counts["layout"] == "triplet" and counts["with_scores"] and counts["records"] == 15
    b = do_import("sentence_transformers", tmp_path / f"st{suffix}", tmp_path / "prep", "b")
    assert snapshot(b) == snapshot(a)


def test_tevatron_import_keeps_ids_titles_and_merges_repeats(tmp_path):
    ds = do_import("tevatron", make_source(tmp_path, "tevatron"), tmp_path / "prep", "tev")
    passages = {p["id"]: p for p in iter_passages(ds.passages)}
    assert passages["d3"] == {"id": "d3", "text": "bees eat many things.", "title": "Bees"}
    noid = content_id("", "a passage without an id about cats and tabs")  # the tab became a space
    assert passages[noid]["text"] == "a passage without an id about cats and tabs"
    assert len(passages) == 20  # 10 docids (each seen twice: positive and a negative) + 10 without ids
    counts = ds.read_meta()["counts"]
    assert counts["passage_occurrences"] == 30 and counts["duplicate_passages_merged"] == 10
    ex = {e["query_id"]: e for e in read_retriever_json(ds.train) + read_retriever_json(ds.dev)}["103"]
    assert [c["passage_id"] for c in ex["positive_ctxs"]] == ["d3"] and ex["qrels"] == {"d3": 1}
    assert [c["passage_id"] for c in ex["hard_negative_ctxs"]] == ["d4", content_id("", "a passage without an id about bees and tabs")]
    # the BM25 miner's view: queries and qrels of both splits
    assert set(read_queries(ds.queries)) == {str(100 + i) for i in range(10)}
    assert sum(len(read_qrels(ds.qrels(s))) for s in ("train", "dev")) == 10


def test_flagembedding_scores_and_prompt_are_kept(tmp_path):
    ds = do_import("flagembedding", make_source(tmp_path, "flagembedding"), tmp_path / "prep", "flag")
    lines = [json.loads(x) for x in (ds.root / FILE_NAME).read_text().splitlines()]
    assert len(lines) == 10 and {ln["split"] for ln in lines} == {"train", "dev"}
    by_q = {ln["question"]: dict(zip(ln["passage_ids"], ln["scores"])) for ln in lines}
    for row in flag_rows():  # the imported scores are the file's, passage by passage
        want = {content_id("", t): s for t, s in zip(row["pos"] + row["neg"], row["pos_scores"] + row["neg_scores"])}
        assert by_q[row["query"]] == want
    exs = read_retriever_json(ds.train)
    assert all(ex["prompt"] == "Represent this query: " for ex in exs)
    meta = ds.read_meta()
    # 30 occurrences, 11 passages: the shared negative in every record, each positive again as a neighbour's negative
    assert meta["counts"]["duplicate_passages_merged"] == 19 and meta["counts"]["passages"] == 11
    assert any("model.question_prefix" in n for n in meta["notes"])


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".csv"])
def test_sentence_transformers_layouts_and_scores(tmp_path, suffix):
    table = st_table(with_scores=True, k=3)
    ds = do_import("sentence_transformers", write_st(tmp_path / f"st{suffix}", table), tmp_path / "prep", "st")
    scores = read_teacher_scores(ds.root / FILE_NAME)
    exs = {ex["question"]: ex for ex in read_retriever_json(ds.train) + read_retriever_json(ds.dev)}
    for i, q in enumerate(table["anchor"]):
        ex = exs[q]
        texts = [table["positive"][i]] + [table[f"negative_{j}"][i] for j in (1, 2, 3)]
        assert [c["text"] for c in ex["positive_ctxs"] + ex["hard_negative_ctxs"]] == texts
        assert scores[ex["query_id"]] == {content_id("", t): s for t, s in zip(texts, table["scores"][i])}


def test_sentence_transformers_triplets_merge_by_anchor(tmp_path):
    # the miner's triplet layout: one row per (anchor, positive, negative)
    rows = [{"query": "q one", "answer": "pos one", "negative": n} for n in ("n a", "n b", "n c")]
    ds = do_import("sentence_transformers", _write_jsonl(tmp_path / "t.jsonl", rows + [
        {"query": "q two", "answer": "pos two", "negative": "n a"}]), tmp_path / "prep", "trip",
        dev_fraction=0.5)
    exs = {ex["question"]: ex for ex in read_retriever_json(ds.train) + read_retriever_json(ds.dev)}
    assert [c["text"] for c in exs["q one"]["hard_negative_ctxs"]] == ["n a", "n b", "n c"]
    assert ds.read_meta()["counts"]["questions_merged"] == 2


def test_triples_with_a_collection_use_its_ids_and_whole_corpus(tmp_path):
    (tmp_path / "collection.tsv").write_text("".join(f"{i}\tpassage number {i}\n" for i in range(12)), encoding="utf-8")
    (tmp_path / "ids.tsv").write_text("first query\t0\t5\nfirst query\t0\t6\nsecond query\t1\t0\n", encoding="utf-8")
    ds = do_import("triples", tmp_path / "ids.tsv", tmp_path / "prep", "marco", corpus=str(tmp_path / "collection.tsv"),
                   dev_fraction=0.5)
    assert [p["id"] for p in iter_passages(ds.passages)] == [str(i) for i in range(12)]
    exs = {ex["question"]: ex for ex in read_retriever_json(ds.train) + read_retriever_json(ds.dev)}
    assert [c["passage_id"] for c in exs["first query"]["hard_negative_ctxs"]] == ["5", "6"]
    assert exs["second query"]["positive_ctxs"][0]["text"] == "passage number 1"


def test_msmarco_id_triples_with_queries_and_collection(tmp_path):
    (tmp_path / "collection.tsv").write_text("".join(f"{i}\tpassage number {i}\n" for i in range(6)), encoding="utf-8")
    (tmp_path / "queries.tsv").write_text("7\tfirst query\n9\tsecond query\n", encoding="utf-8")
    (tmp_path / "qidpid.tsv").write_text("7\t0\t5\n9\t1\t0\n7\t0\t4\n", encoding="utf-8")
    ds = do_import("triples", tmp_path / "qidpid.tsv", tmp_path / "prep", "marco", corpus=str(tmp_path / "collection.tsv"),
                   queries=str(tmp_path / "queries.tsv"), dev_fraction=0.5)
    exs = {ex["query_id"]: ex for ex in read_retriever_json(ds.train) + read_retriever_json(ds.dev)}
    assert exs["7"]["question"] == "first query" and exs["7"]["qrels"] == {"0": 1}
    assert [c["passage_id"] for c in exs["7"]["hard_negative_ctxs"]] == ["5", "4"]
    (tmp_path / "qidpid.tsv").write_text("7\t0\t5\n8\t1\t0\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"qidpid\.tsv:2: field 'query': query id '8' is not in the queries file"):
        collect("triples", {"train": tmp_path / "qidpid.tsv", "corpus": tmp_path / "collection.tsv",
                            "queries": tmp_path / "queries.tsv"})


def test_dev_file_is_used_and_train_plus_dev_hold_every_question(tmp_path):
    rows = tevatron_rows()
    _write_jsonl(tmp_path / "train.jsonl", rows[:7])
    _write_jsonl(tmp_path / "dev.jsonl", rows[7:])
    ds = do_import("tevatron", tmp_path, tmp_path / "prep", "folder")  # a folder with train + dev
    assert [ex["query_id"] for ex in read_retriever_json(ds.dev)] == ["107", "108", "109"]
    assert len(read_retriever_json(ds.train)) == 7
    _write_jsonl(tmp_path / "leak.jsonl", rows[:1])
    with pytest.raises(DataError, match=r"leak\.jsonl:1: .*also in the train data"):
        do_import("tevatron", tmp_path / "train.jsonl", tmp_path / "prep", "leak", dev_path=str(tmp_path / "leak.jsonl"))


def test_a_positive_listed_as_negative_stays_positive_only(tmp_path):
    rows = [{"query": "q", "pos": ["p"], "neg": ["p", "n"]}, {"query": "r", "pos": ["p2"], "neg": ["n"]}]
    ds = do_import("flagembedding", _write_jsonl(tmp_path / "f.jsonl", rows), tmp_path / "prep", "f", dev_fraction=0.5)
    exs = {ex["question"]: ex for ex in read_retriever_json(ds.train) + read_retriever_json(ds.dev)}
    assert [c["text"] for c in exs["q"]["hard_negative_ctxs"]] == ["n"]
    assert ds.read_meta()["counts"]["negatives_dropped_as_positive"] == 1


# ------------------------------------------------------------------ malformed records: one line each

BAD = [
    ("tevatron", "tev.jsonl", {"query_id": "1", "query": "q", "positive_passages": [{"docid": "d", "title": "t"}]},
     "positive_passages[0].text"),
    ("tevatron", "tev.jsonl", {"query_id": "1", "query": "q", "positive_passages": []}, "positive_passages"),
    ("flagembedding", "f.jsonl", {"query": "q", "pos": ["a"], "neg": ["b"], "neg_scores": [0.1, 0.2]}, "neg_scores"),
    ("flagembedding", "f.jsonl", {"query": "q", "pos": "a"}, "pos"),
    ("sentence_transformers", "s.jsonl", {"anchor": "q", "positive": "p", "negative": 3}, "negative"),
    ("sentence_transformers", "s.jsonl", {"anchor": "q", "positive": "p", "negative": "n", "scores": [1, "x"]}, "scores"),
]


@pytest.mark.parametrize("fmt,name,bad,field", BAD)
def test_malformed_record_names_file_line_and_field(tmp_path, fmt, name, bad, field):
    good = {"tevatron": tevatron_rows()[0], "flagembedding": flag_rows()[0],
            "sentence_transformers": {"anchor": "q0", "positive": "p0", "negative": "n0", "scores": [1, 0]}}[fmt]
    if fmt == "sentence_transformers" and "scores" not in bad:
        good = {k: v for k, v in good.items() if k != "scores"}
    path = _write_jsonl(tmp_path / name, [good, good, bad])
    with pytest.raises(DataError) as err:
        collect(fmt, {"train": path})
    assert str(err.value).startswith(f"{path}:3: field '{field}'")


def test_malformed_triples_and_collection(tmp_path):
    (tmp_path / "t.tsv").write_text("q\tp\tn\nq2\tp2\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"t\.tsv:2: field 'positive': expected 3 tab-separated"):
        collect("triples", {"train": tmp_path / "t.tsv"})
    (tmp_path / "c.tsv").write_text("1\tone\n2\ttwo\n", encoding="utf-8")
    (tmp_path / "ids.tsv").write_text("q\t1\t2\nq\t1\t9\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"ids\.tsv:2: field 'negative': passage id '9' is not in the collection"):
        collect("triples", {"train": tmp_path / "ids.tsv", "corpus": tmp_path / "c.tsv"})


def test_one_id_two_texts_and_csv_row_errors(tmp_path):
    rows = tevatron_rows()[:2]
    rows[1]["negative_passages"][0] = {"docid": "d0", "title": "Cats", "text": "another text"}
    with pytest.raises(DataError, match=r"tev\.jsonl:2: field 'negative_passages\[0\]\.text': passage id 'd0' has another"):
        collect("tevatron", {"train": _write_jsonl(tmp_path / "tev.jsonl", rows)})
    (tmp_path / "s.csv").write_text('anchor,positive,negative\nq,p,n\n"q2,"p2\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"s\.csv:3: "):
        collect("sentence_transformers", {"train": tmp_path / "s.csv"})
    (tmp_path / "l.csv").write_text("anchor,positive,label\nq,p,1\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"field 'label': labeled layout"):
        collect("sentence_transformers", {"train": tmp_path / "l.csv"})


def _corrupt(data: bytes, op: int, pos: float, junk: bytes) -> bytes:
    i = int(pos * len(data))
    if op == 0:
        return data[:i] + data[i + 1 + len(junk):]  # delete a span
    if op == 1:
        return data[:i] + junk + data[i:]  # insert bytes
    if op == 2:
        return data[:i]  # truncate
    return data[:i] + junk[:1] + data[i + 1:]  # overwrite one byte


SOURCES = {"tevatron": "tev.jsonl", "flagembedding": "flag.jsonl", "sentence_transformers": "st.csv",
           "triples": "triples.tsv"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(sorted(SOURCES)), op=st.integers(0, 3), pos=st.floats(0, 1, exclude_max=True),
       junk=st.binary(min_size=1, max_size=6) | st.sampled_from([b'"', b"\t", b"\n", b"{", b"]", b",", b"\xff", b"null"]))
def test_fuzzed_files_import_or_fail_with_one_line(tmp_path_factory, fmt, op, pos, junk):
    tmp = tmp_path_factory.mktemp("fuzz")
    if fmt == "sentence_transformers":
        src = write_st(tmp / "st.csv", st_table())
    else:
        src = make_source(tmp, fmt)
    src.write_bytes(_corrupt(src.read_bytes(), op, pos, junk))
    try:
        col = collect(fmt, {"train": src})
    except DataError as err:
        msg = str(err)
        assert msg.startswith(f"{src}:") and "\n" not in msg
        return
    # a corruption that still parses imports deterministically
    again = collect(fmt, {"train": src})
    assert col.examples("train") == again.examples("train") and col.passages == again.passages


@pytest.mark.parametrize("fmt", sorted(SOURCES))
def test_harmless_variants_import_identically(tmp_path, fmt):
    # Windows line endings, a byte-order mark and blank lines change no record
    src = write_st(tmp_path / "st.csv", st_table()) if fmt == "sentence_transformers" else make_source(tmp_path, fmt)
    want = collect(fmt, {"train": src})
    lines = src.read_bytes().split(b"\n")
    src.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(lines[:1] + [b""] + lines[1:] if fmt != "sentence_transformers"
                                                   else lines) + b"\r\n\r\n")
    got = collect(fmt, {"train": src})
    assert got.examples("train") == want.examples("train") and got.teacher_scores() == want.teacher_scores()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.floats(0, 1, exclude_max=True), junk=st.binary(min_size=1, max_size=8))
def test_fuzzed_parquet_fails_with_one_line(tmp_path_factory, pos, junk):
    src = write_st(tmp_path_factory.mktemp("pq") / "st.parquet", st_table())
    src.write_bytes(_corrupt(src.read_bytes(), 1, pos, junk))
    try:
        collect("sentence_transformers", {"train": src})
    except DataError as err:
        assert str(err).startswith(f"{src}:") and "\n" not in str(err)


# ------------------------------------------------------------------ the command line


def test_cli_import_and_export(tmp_path):
    src = make_source(tmp_path, "flagembedding")
    proc = run_as_subprocess([str(BIN / "dpr-data"), "data=import", "data.format=flagembedding", f"data.path={src}",
                           "data.name=mine", f"data_dir={tmp_path / 'prep'}"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ds = DatasetPaths(tmp_path / "prep" / "mine")
    assert proc.stdout.strip().endswith(str(ds.root)) and ds.kind == "qrels"
    proc = run_as_subprocess([str(BIN / "dpr-data"), "export", "data=mine", f"data_dir={tmp_path / 'prep'}",
                              "format=sentence_transformers", "output=mine.jsonl"], capture_output=True, text=True,
                             cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(x) for x in (tmp_path / "mine.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and list(rows[0]) == ["anchor", "positive", "negative_1", "negative_2", "scores"]
    _write_jsonl(src, flag_rows()[:3] + [{"query": "q", "pos": []}])
    proc = run_as_subprocess([str(BIN / "dpr-data"), "data=import", "data.format=flagembedding", f"data.path={src}",
                           "data.name=bad", f"data_dir={tmp_path / 'prep'}"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip() == f"dpr-data: error: {src}:4: field 'pos': empty list"
    assert not (tmp_path / "prep" / "bad").exists()


def test_an_imported_set_trains_as_qrels_data(tmp_path, tiny_model_dir, one_thread):
    """What ``dpr-train data=import data.name=<name>`` does: qrels data (every positive judged, dev nDCG@10)."""
    from omegaconf import OmegaConf

    from dpr.training.train import train

    do_import("tevatron", make_source(tmp_path, "tevatron"), tmp_path / "prep", "tev", dev_fraction=0.2)
    data = OmegaConf.to_container(OmegaConf.load(Path(__file__).parents[2] / "conf" / "data" / "import.yaml"))
    summary = train({
        "model": {"name": str(tiny_model_dir), "pooling": "mean", "question_max_length": 32, "passage_max_length": 64},
        "data": {**data, "name": "tev"}, "logger": {"type": "none"},
        "train": {"batch_size": 4, "hard_negatives": 1, "max_steps": 2, "print_every": 1000, "val_batch_size": 8,
                  "precision": "fp32", "save_every": 0},
        "data_dir": str(tmp_path / "prep"), "output_dir": str(tmp_path / "run"), "seed": 7})
    assert summary["resolved"] == {"multi_positive": True, "best_metric": "ndcg@10"}
    assert summary["best_metric"]["name"] == "ndcg@10" and summary["steps"] == 2


@pytest.mark.slow
def test_test_fraction_holds_questions_out_and_the_pipeline_runs_end_to_end(tmp_path, tiny_model_dir):
    """``data.test_fraction``: a seeded share of the questions becomes qrels/test.tsv (never in train/dev), so
    ``dpr-pipeline data=import …`` runs end to end on a peer-format set and reports against BM25."""
    import os

    src = make_source(tmp_path, "tevatron")
    ds = do_import("tevatron", src, tmp_path / "prep", "tev", dev_fraction=0.2, test_fraction=0.2)
    test = read_qrels(ds.qrels("test"))
    train_ids = {ex["query_id"] for ex in read_retriever_json(ds.train)}
    dev_ids = {ex["query_id"] for ex in read_retriever_json(ds.dev)}
    assert len(test) == 2 and not (set(test) & (train_ids | dev_ids))
    assert set(test) | train_ids | dev_ids == {str(100 + i) for i in range(10)}   # every question in one split
    assert set(read_queries(ds.queries)) >= set(test)
    assert ds.read_meta()["counts"]["questions"]["test"] == 2
    with pytest.raises(DataError, match="test_fraction must lie in"):
        do_import("tevatron", src, tmp_path / "prep2", "tev", test_fraction=1.5)

    bin_dir = Path(sys.executable).parent
    out = tmp_path / "run"
    cmd = [str(bin_dir / "dpr-pipeline"), "data=import", "data.format=tevatron", f"data.path={src}", "data.name=tev2",
           "data.dev_fraction=0.2", "data.test_fraction=0.2", f"data_dir={tmp_path / 'prep'}", f"output_dir={out}",
           f"model.name={tiny_model_dir}", "model.pooling=cls", "train.max_steps=2", "train.batch_size=4",
           "train.hard_negatives=1", "train.save_every=0", "train.frozen_steps=0", "bm25.num_negatives=2",
           "retrieve.k=5", "encode.batch_size=4", "train.precision=fp32"]
    proc = run_as_subprocess(cmd, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"},
                             timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "eval" / "report.json").read_text())
    assert {"bm25", "dense", "hybrid"} <= set(report["systems"])
    assert all(0.0 <= m["ndcg@10"] <= 1.0 for m in report["systems"].values())
