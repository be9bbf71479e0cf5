"""Dataset preparation: chunking, fetching, the four recipes on the real mirror, determinism, atomicity, CLI."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dpr.atomic import sha256_file
from dpr.data.beir import read_qrels, read_queries
from dpr.data.chunking import chunk_of_span, chunk_words
from dpr.data.dataset import DatasetPaths
from dpr.data.passages import iter_passages
from dpr.data.prepare import prepare_dataset
from dpr.data.prepare.common import seeded_split
from dpr.data.qa import read_qa_tsv
from dpr.data.retriever_json import read_retriever_json
from dpr.data.sources import Source, fetch, load_registry
from dpr.errors import DataError

REPO = Path(__file__).resolve().parents[2]
DPR_DATA = Path(sys.executable).parent / "dpr-data"

# The test articles of squad1_open (seed 13): pinned so that another machine or Python must give the same split.
SQUAD_TEST_ARTICLES = [
    "Ctenophora", "Economic_inequality", "French_and_Indian_War", "Genghis_Khan", "Harvard_University",
    "Teacher", "United_Methodist_Church", "University_of_Chicago", "Victoria_and_Albert_Museum",
]


def _cfg(name: str, **over) -> dict:
    import yaml

    cfg = yaml.safe_load((REPO / "conf" / "data" / f"{name}.yaml").read_text())
    cfg.pop("mirror_dir"), cfg.pop("cache_dir")  # Hydra interpolations; the tests pass the mirror explicitly
    cfg.update(over)
    return cfg


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}


def _leftovers(data_dir: Path) -> list[str]:
    return sorted(p.name for p in data_dir.iterdir()) if data_dir.exists() else []


# --- chunking and splitting -------------------------------------------------------------------------

def test_chunk_words_and_span_mapping():
    text = "  w0 w1\tw2\nw3 w4 w5 w6  "
    chunks = chunk_words(text, 3)
    assert chunks.texts == ["w0 w1 w2", "w3 w4 w5", "w6"]
    assert [text[s:e] for s, e in zip(chunks.starts, chunks.ends)] == ["w0 w1\tw2", "w3 w4 w5", "w6"]
    assert chunk_of_span(chunks, text.index("w4"), "w4 w5") == (1, True)
    assert chunk_of_span(chunks, text.index("w1"), "w1\tw2\nw3") == (0, False)  # straddles: chunk of its start
    assert chunk_of_span(chunks, text.index("w3") - 1, "\nw3") == (1, True)  # leading space skipped
    assert chunk_of_span(chunks, text.index("1"), "1") == (0, True)  # starts inside a word
    with pytest.raises(ValueError):
        chunk_words(text, 0)


def test_seeded_split_is_order_independent_and_pinned():
    items = [f"a{i}" for i in range(10)]
    fr = {"train": 0.7, "dev": 0.1, "test": 0.2}
    one, two = seeded_split(items, fr, 3), seeded_split(list(reversed(items)), fr, 3)
    assert one == two and [len(one[k]) for k in fr] == [7, 1, 2]
    assert sorted(sum(one.values(), [])) == sorted(items)
    assert one["test"] == seeded_split(items, fr, 3)["test"] != seeded_split(items, fr, 4)["test"]


# --- fetching -----------------------------------------------------------------------------------------

def _entry(tmp_path: Path, payload: bytes, **over) -> Source:
    src = tmp_path / "upstream" / "file.bin"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(payload)
    fields = {"name": "toy", "path": "toy/file.bin", "sha256": hashlib.sha256(payload).hexdigest(),
              "size": len(payload), "url": src.as_uri()}
    fields.update(over)
    return Source(**fields)


def test_fetch_downloads_into_cache_and_verifies(tmp_path):
    src = _entry(tmp_path, b"hello world\n")
    cache = tmp_path / "cache"
    path = fetch(src, None, cache)
    assert path == cache / "toy" / "file.bin" and path.read_bytes() == b"hello world\n"
    path.write_bytes(b"damaged")  # a damaged cache entry is fetched again
    assert fetch(src, None, cache).read_bytes() == b"hello world\n"


def test_fetch_download_with_wrong_digest_leaves_nothing(tmp_path):
    src = _entry(tmp_path, b"payload", sha256="0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=f"expected {'0' * 64}, got {hashlib.sha256(b'payload').hexdigest()}"):
        fetch(src, None, cache)
    assert not (cache / "toy" / "file.bin").exists()
    assert _leftovers(cache / "toy") == []


def test_fetch_extracts_archive_member(tmp_path):
    member = b'{"a": 1}\n'
    zpath = tmp_path / "upstream" / "bundle.zip"
    zpath.parent.mkdir(parents=True)
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("Top Folder/inner.json", member)
        zf.writestr("Top Folder/other.json", b"{}")
    zsrc = Source(name="bundle", path="toy/bundle.zip", sha256=sha256_file(zpath), url=zpath.as_uri())
    inner = Source(name="inner", path="toy/inner.json", sha256=hashlib.sha256(member).hexdigest(), archive="bundle", member="inner.json")
    path = fetch("inner", None, tmp_path / "cache", registry={"bundle": zsrc, "inner": inner})
    assert path.read_bytes() == member


def test_registry_lists_every_recipe_source():
    from dpr.data.prepare import RECIPES

    registry = load_registry()
    for recipe in RECIPES.values():
        for name in recipe.SOURCES.values():
            assert len(registry[name].sha256) == 64 and registry[name].license


# --- recipes on synthetic sources (no mirror needed) ---------------------------------------------------

def test_squad1_open_recipe_on_synthetic_squad(tmp_path):
    from dpr.data.prepare import squad1_open
    from dpr.data.squad import write_squad

    words = [f"w{i}" for i in range(150)]
    context = " ".join(words)
    articles = [
        {"title": f"Article_{a}", "paragraphs": [{"context": context, "qas": [
            {"id": f"{a}-0", "question": "first?", "answers": [{"text": "w3", "answer_start": context.index("w3 ")}]},
            {"id": f"{a}-1", "question": "second?", "answers": [
                {"text": "w120", "answer_start": context.index("w120")},
                {"text": "w99 w100", "answer_start": context.index("w99 ")},  # straddles chunks 0 and 1
            ]},
        ]}]}
        for a in range(10)
    ]
    write_squad(tmp_path / "squad.json", articles)
    out = tmp_path / "out"
    out.mkdir()
    result = squad1_open.build(dict(squad1_open.DEFAULTS), {"squad": tmp_path / "squad.json"}, out)
    c = result["counts"]
    assert c["articles"] == {"train": 7, "dev": 1, "test": 2} and c["passages"] == 20 and c["straddling_answers"] == 8
    train = read_retriever_json(out / "train.json")
    second = [ex for ex in train if ex["question"] == "second?"][0]
    assert [p["passage_id"].rsplit("-", 1)[1] for p in second["positive_ctxs"]] == ["1", "0"]
    assert second["answers"] == ["w120", "w99 w100"] and second["positive_ctxs"][0]["title"].startswith("Article ")
    assert len(read_qa_tsv(out / "test.qa.tsv")) == 4


def test_nfcorpus_recipe_empty_text_and_positive_order(tmp_path):
    from dpr.data.beir import write_beir_corpus, write_qrels, write_queries
    from dpr.data.prepare import nfcorpus

    write_beir_corpus(tmp_path / "corpus.jsonl", [
        {"id": "d1", "text": "first doc", "title": "T1"},
        {"id": "d2", "text": "", "title": "Title only"},
        {"id": "d3", "text": "third doc", "title": ""},
    ])
    write_queries(tmp_path / "queries.jsonl", {"q1": "query one", "q2": "query two"})
    write_qrels(tmp_path / "train.tsv", {"q1": {"d1": 1, "d2": 2, "d3": 0}, "q2": {"d3": 0}})
    write_qrels(tmp_path / "dev.tsv", {"q2": {"d1": 1}})
    write_qrels(tmp_path / "test.tsv", {"q2": {"d3": 2}})
    files = {"corpus": tmp_path / "corpus.jsonl", "queries": tmp_path / "queries.jsonl",
             **{f"qrels_{s}": tmp_path / f"{s}.tsv" for s in ("train", "dev", "test")}}
    out = tmp_path / "out"
    out.mkdir()
    result = nfcorpus.build({"seed": 0, "max_positives": None}, files, out)
    assert result["counts"]["empty_text_title_used"] == 1
    passages = {p["id"]: p for p in iter_passages(out / "passages.tsv")}
    assert passages["d2"] == {"id": "d2", "text": "Title only", "title": "Title only"}
    train = read_retriever_json(out / "train.json")
    assert len(train) == 1  # q2 has no relevant doc in train
    assert [p["passage_id"] for p in train[0]["positive_ctxs"]] == ["d2", "d1"]  # most relevant first
    assert train[0]["qrels"] == {"d1": 1, "d2": 2}  # every judged-relevant doc with its grade, not d3 (0)
    capped = nfcorpus.build({"seed": 0, "max_positives": 1}, files, out)
    assert capped["counts"]["positives_dropped_by_cap"]["train"] == 1
    train = read_retriever_json(out / "train.json")
    # the cap drops texts, not judgements: d1 is still known relevant (so never a negative for q1)
    assert [p["passage_id"] for p in train[0]["positive_ctxs"]] == ["d2"] and train[0]["qrels"] == {"d1": 1, "d2": 2}


# --- recipes on the real data -------------------------------------------------------------------------

def test_squad1_open_counts_and_positives(mirror_dir, tmp_path):
    root = prepare_dataset(_cfg("squad1_open"), tmp_path / "prep", mirror_dir=mirror_dir)
    meta = json.loads((root / "meta.json").read_text())
    c = meta["counts"]
    assert sum(c["articles"].values()) == 48 and c["articles"] == {"train": 34, "dev": 5, "test": 9}
    assert c["paragraphs"] == 2067
    assert sum(c["questions"].values()) == 10570
    assert meta["splits"]["test_articles"] == SQUAD_TEST_ARTICLES
    assert meta["kind"] == "qa" and meta["sources"] == {"squad-v1.1/dev-v1.1.json": sha256_file(mirror_dir / "squad-v1.1" / "dev-v1.1.json")}

    ds = DatasetPaths(root)
    passages = {p["id"]: p for p in iter_passages(ds.passages)}
    assert len(passages) == c["passages"] and all(len(p["text"].split()) <= 100 for p in passages.values())
    train, dev = read_retriever_json(ds.train), read_retriever_json(ds.dev)
    test = read_qa_tsv(ds.test_qa)
    assert (len(train), len(dev), len(test)) == (c["questions"]["train"], c["questions"]["dev"], c["questions"]["test"])
    assert len(read_qa_tsv(ds.dev_qa)) == len(dev)
    test_titles = {t.replace("_", " ") for t in SQUAD_TEST_ARTICLES}
    missing = 0
    for ex in train + dev:
        pos = ex["positive_ctxs"][0]
        assert passages[pos["passage_id"]]["text"] == pos["text"]
        assert pos["title"] not in test_titles  # no test article leaks into training
        missing += not any(" ".join(a.split()) in pos["text"] for a in ex["answers"])
    assert missing <= c["straddling_answers"]  # only a span cut by a chunk boundary may miss its passage


def test_squad1_open_identical_across_runs(mirror_dir, tmp_path):
    a = prepare_dataset(_cfg("squad1_open"), tmp_path / "one", mirror_dir=mirror_dir)
    b = prepare_dataset(_cfg("squad1_open"), tmp_path / "two", mirror_dir=mirror_dir)
    assert _digests(a) == _digests(b)
    c = prepare_dataset(_cfg("squad1_open", seed=14), tmp_path / "three", mirror_dir=mirror_dir)
    assert json.loads((c / "meta.json").read_text())["splits"]["test_articles"] != SQUAD_TEST_ARTICLES


def test_mined_training_files_keep_dataset_up_to_date(mirror_dir, tmp_path, caplog):
    """dpr-bm25 mine=true rewrites train.json/dev.json with hard negatives: that must not trigger a rebuild."""
    from dpr.data.retriever_json import write_retriever_json

    cfg = _cfg("sciq_open")
    root = prepare_dataset(cfg, tmp_path, mirror_dir=mirror_dir)
    dev = read_retriever_json(root / "dev.json")
    dev[0]["hard_negative_ctxs"] = [dict(dev[1]["positive_ctxs"][0])]
    write_retriever_json(root / "dev.json", dev)
    (root / "bm25_index").mkdir()
    caplog.set_level("INFO", logger="dpr.data.prepare")
    prepare_dataset(cfg, tmp_path, mirror_dir=mirror_dir)
    assert "up to date" in caplog.text and (root / "bm25_index").is_dir()
    assert read_retriever_json(root / "dev.json")[0]["hard_negative_ctxs"]
    # a changed recipe setting rebuilds (and drops what was derived from the old version)
    prepare_dataset(_cfg("sciq_open", dev_fraction=0.2), tmp_path, mirror_dir=mirror_dir)
    assert json.loads((root / "meta.json").read_text())["config"]["dev_fraction"] == 0.2
    assert not (root / "bm25_index").exists()


def test_up_to_date_skip_force_and_tampered_output(mirror_dir, tmp_path, caplog):
    cfg = _cfg("nq_open_dev")
    root = prepare_dataset(cfg, tmp_path, mirror_dir=mirror_dir)
    stamp = (root / "meta.json").stat().st_mtime_ns
    caplog.set_level("INFO", logger="dpr.data.prepare")
    assert prepare_dataset(dict(cfg, unrelated_key=1), tmp_path, mirror_dir=mirror_dir) == root
    assert "up to date" in caplog.text and (root / "meta.json").stat().st_mtime_ns == stamp
    prepare_dataset(cfg, tmp_path, mirror_dir=mirror_dir, force=True)
    assert (root / "meta.json").stat().st_mtime_ns != stamp
    (root / "test.qa.tsv").write_text("tampered\t[\"x\"]\n")  # a changed output is rebuilt
    prepare_dataset(cfg, tmp_path, mirror_dir=mirror_dir)
    assert len(read_qa_tsv(root / "test.qa.tsv")) == 3610
    assert _leftovers(tmp_path) == ["nq_open_dev"]


def test_sciq_open(mirror_dir, tmp_path):
    root = prepare_dataset(_cfg("sciq_open"), tmp_path, mirror_dir=mirror_dir)
    c = json.loads((root / "meta.json").read_text())["counts"]
    removed = c["removed_test_overlap"]
    assert removed["test_questions_in_train"] == 7 and removed["positive_is_a_test_support"] == 1
    assert removed["same_question_and_answer"] == 6  # the 7th training twin has no support: never eligible
    assert c["questions"]["train"] + c["questions"]["dev"] == 10481 - 6 - 1
    assert c["questions"]["test"] == 1000
    assert c["test_without_support"] == 113 and 1000 <= c["questions"]["dev"] <= 1100
    ds = DatasetPaths(root)
    passages = {p["id"]: p["text"] for p in iter_passages(ds.passages)}
    assert len(passages) == c["passages"] == len(set(passages.values()))
    train, dev = read_retriever_json(ds.train), read_retriever_json(ds.dev)
    train_pos = {ex["positive_ctxs"][0]["passage_id"] for ex in train}
    assert not train_pos & {ex["positive_ctxs"][0]["passage_id"] for ex in dev}  # grouped by support
    assert all(passages[ex["positive_ctxs"][0]["passage_id"]] == ex["positive_ctxs"][0]["text"] for ex in train[:200])
    test = read_qa_tsv(ds.test_qa)
    assert len(test) == 1000
    # no training or dev question repeats a test question with its answer
    norm = lambda q, a: (" ".join(q.lower().split()), " ".join(a.lower().split()))  # noqa: E731
    test_keys = {norm(p.question, p.answers[0]) for p in test}
    assert not any(norm(ex["question"], ex["answers"][0]) in test_keys for ex in train + dev)


def test_nfcorpus(mirror_dir, tmp_path):
    root = prepare_dataset(_cfg("nfcorpus"), tmp_path, mirror_dir=mirror_dir)
    meta = json.loads((root / "meta.json").read_text())
    c = meta["counts"]
    assert meta["kind"] == "qrels" and c["passages"] == 3633 and c["queries"] == 3237
    assert c["qrels_pairs"] == {"train": 110575, "dev": 11385, "test": 12334}
    assert c["questions"] == {"train": 2590, "dev": 324, "test": 323}
    ds = DatasetPaths(root)
    assert ds.kind == "qrels"
    assert b"\r" not in ds.qrels("test").read_bytes()
    queries = read_queries(ds.queries)
    doc_ids = {p["id"] for p in iter_passages(ds.passages)}
    test_qrels = read_qrels(ds.qrels("test"), queries, doc_ids)
    assert test_qrels == read_qrels(mirror_dir / "nfcorpus" / "qrels" / "test.tsv")
    train = read_retriever_json(ds.train)
    assert len(train) == 2590 and all(ex["answers"] == [] and 1 <= len(ex["positive_ctxs"]) <= 16 for ex in train)


def test_nq_open_dev(mirror_dir, tmp_path):
    root = prepare_dataset(_cfg("nq_open_dev"), tmp_path, mirror_dir=mirror_dir)
    pairs = read_qa_tsv(root / "test.qa.tsv")
    assert len(pairs) == 3610 and pairs[0].answers == ["14 December 1972 UTC", "December 1972"]
    assert not (root / "passages.tsv").exists()
    assert json.loads((root / "meta.json").read_text())["corpus"] is None


# --- failures leave nothing behind --------------------------------------------------------------------

def _corrupt_mirror(mirror_dir: Path, tmp_path: Path) -> Path:
    """A copy of the mirror's SQuAD file with one byte changed (same size)."""
    fake = tmp_path / "fake_mirror"
    dest = fake / "squad-v1.1" / "dev-v1.1.json"
    dest.parent.mkdir(parents=True)
    data = bytearray((mirror_dir / "squad-v1.1" / "dev-v1.1.json").read_bytes())
    data[1000] = ord("X") if data[1000] != ord("X") else ord("Y")
    dest.write_bytes(bytes(data))
    return fake


def test_corrupted_mirror_refused_without_partial_output(mirror_dir, tmp_path):
    fake = _corrupt_mirror(mirror_dir, tmp_path)
    data_dir = tmp_path / "prep"
    with pytest.raises(DataError, match="sha256 mismatch .* expected 95aa6a52"):
        prepare_dataset(_cfg("squad1_open"), data_dir, mirror_dir=fake)
    assert _leftovers(data_dir) == []


def test_failure_mid_build_keeps_previous_output(mirror_dir, tmp_path, monkeypatch):
    from dpr.data.prepare import nq_open_dev

    root = prepare_dataset(_cfg("nq_open_dev"), tmp_path, mirror_dir=mirror_dir)
    before = _digests(root)

    def broken_build(cfg, files, out):
        (out / "test.qa.tsv").write_text("half-written\n")
        raise DataError(files["dev"], "simulated failure", line=7, field="question")

    monkeypatch.setattr(nq_open_dev, "build", broken_build)
    with pytest.raises(DataError, match="simulated failure"):
        prepare_dataset(_cfg("nq_open_dev"), tmp_path, mirror_dir=mirror_dir, force=True)
    assert _digests(root) == before and _leftovers(tmp_path) == ["nq_open_dev"]
    shutil.rmtree(root)
    with pytest.raises(DataError):
        prepare_dataset(_cfg("nq_open_dev"), tmp_path, mirror_dir=mirror_dir)
    assert _leftovers(tmp_path) == []


# --- the dpr-data command -------------------------------------------------------------------------------

def _run_cli(*args: str, env_mirror: Path | None = None) -> subprocess.CompletedProcess:
    from tests.run_command import run_command  # the console script's main, in-process

    return run_command([DPR_DATA.name, *args], env={"DPR_DATA_MIRROR": str(env_mirror) if env_mirror else None})


def test_cli_bad_mirror_one_line_error(mirror_dir, tmp_path):
    fake = _corrupt_mirror(mirror_dir, tmp_path)
    proc = _run_cli("data=squad1_open", f"data_dir={tmp_path / 'prep'}", env_mirror=fake)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dpr-data: error:") and "sha256 mismatch" in lines[0], proc.stderr
    assert _leftovers(tmp_path / "prep") == []


def test_cli_prepares_with_mirror_override(mirror_dir, tmp_path):
    proc = _run_cli("data=nq_open_dev", f"data_dir={tmp_path}", f"data.mirror_dir={mirror_dir}")
    assert proc.returncode == 0, proc.stderr
    assert len(read_qa_tsv(tmp_path / "nq_open_dev" / "test.qa.tsv")) == 3610
    assert proc.stdout.strip().splitlines()[-1] == str(tmp_path / "nq_open_dev")


def test_cli_writes_nothing_into_cwd(mirror_dir, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    from tests.run_command import run_command  # in-process, run from cwd as the script would be

    proc = run_command([DPR_DATA.name, "data=nq_open_dev", f"data_dir={tmp_path / 'prep'}",
                        f"data.mirror_dir={mirror_dir}"], cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert list(cwd.iterdir()) == []
