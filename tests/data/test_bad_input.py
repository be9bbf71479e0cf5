"""Every reader rejects malformed input with one DataError naming the file, the line/record and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpr.data.beir import iter_beir_corpus, read_qrels, read_queries
from dpr.data.nq_open import read_nq_open
from dpr.data.passages import iter_passages, write_passages
from dpr.data.qa import read_qa_tsv
from dpr.data.results import read_results, read_trec_run
from dpr.data.retriever_json import read_retriever_json, write_retriever_json
from dpr.data.sciq import read_sciq
from dpr.data.sources import fetch
from dpr.data.squad import read_squad
from dpr.errors import DataError


def _raises(fn, path: Path, line, field: str | None, *words: str) -> str:
    """Run ``fn(path)``; check the DataError names the file, ``:line`` and the field, plus any words."""
    with pytest.raises(DataError) as info:
        result = fn(path)
        if hasattr(result, "__next__"):
            list(result)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg, msg
    if line is not None:
        assert f"{path}:{line}:" in msg, msg
    if field is not None:
        assert f"field '{field}'" in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def _write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return path


# --- passages.tsv ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "content, line, field, word",
    [
        ("id\ttitle\ttext\n1\tt\tx\n", 1, "header", "header"),
        ("", 1, "header", "empty file"),
        ("id\ttext\ttitle\n1\tsome text\tT\n2\tonly two fields\n", 3, "id", "3 tab-separated"),
        ("id\ttext\ttitle\n1\tsome text\tT\n2\t  \tT\n", 3, "text", "empty text"),
        ("id\ttext\ttitle\n1\tsome text\tT\n1\tother text\tT\n", 3, "id", "duplicate passage id '1'"),
        ("id\ttext\ttitle\n1\tsome text\tT\n\ttext\tT\n", 3, "id", "empty"),
    ],
)
def test_passages_bad(tmp_path, content, line, field, word):
    _raises(iter_passages, _write(tmp_path, "psgs.tsv", content), line, field, word)


def test_passages_non_utf8(tmp_path):
    path = _write(tmp_path, "psgs.tsv", b"id\ttext\ttitle\n1\tok\tT\n2\tcaf\xe9 latin-1\tT\n")
    _raises(iter_passages, path, 3, None, "not UTF-8")


def test_passages_writer_refuses_bad_rows(tmp_path):
    with pytest.raises(DataError, match="field 'text'"):
        write_passages(tmp_path / "p.tsv", [("a", "", "T")])
    with pytest.raises(DataError, match="field 'id'"):
        write_passages(tmp_path / "p.tsv", [("a\tb", "text", "T")])
    assert not (tmp_path / "p.tsv").exists()


# --- QA TSV ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "content, line, field, word",
    [
        ('q1\t["a"]\nq2\t["unclosed\n', 2, "answers", "not a JSON list"),
        ('q1\t["a"]\nq2\t{"a": 1}\n', 2, "answers", "expected a list"),
        ('q1\t["a"]\nq2\t[]\n', 2, "answers", "empty answer list"),
        ('q1\t["a"]\nq2\t["ok", 3]\n', 2, "answers", "answer 1"),
        ('q1\t["a"]\n \t["b"]\n', 2, "question", "empty"),
        ('q1\t["a"]\nq2\t["b"]\textra\n', 2, "question", "2 tab-separated"),
        ('q1 without a tab\n', 1, "question", "2 tab-separated"),
    ],
)
def test_qa_tsv_bad(tmp_path, content, line, field, word):
    _raises(read_qa_tsv, _write(tmp_path, "test.qa.tsv", content), line, field, word)


def test_qa_tsv_non_utf8(tmp_path):
    _raises(read_qa_tsv, _write(tmp_path, "t.qa.tsv", b'q1\t["a"]\r\nq\xff2\t["b"]\r\n'), 2, None, "not UTF-8")


# --- retriever JSON -------------------------------------------------------------------------------

def _ex(**over):
    ex = {"question": "q", "answers": ["a"], "positive_ctxs": [{"passage_id": "1", "title": "T", "text": "x"}],
          "negative_ctxs": [], "hard_negative_ctxs": []}
    ex.update(over)
    return ex


def test_retriever_json_broken_json_names_line(tmp_path):
    path = _write(tmp_path, "train.json", '[\n{"question": "q",\n "answers": ["a"]\n "positive_ctxs": []}\n]')
    _raises(read_retriever_json, path, 4, None, "broken JSON")


@pytest.mark.parametrize(
    "bad, field, word",
    [
        ({"question": None}, "question", "expected a string"),
        ({"question": "  "}, "question", "empty"),
        ({"answers": "a"}, "answers", "expected a list"),
        ({"answers": ["a", 1]}, "answers", "item 1"),
        ({"positive_ctxs": {"passage_id": "1"}}, "positive_ctxs", "expected a JSON list"),
        ({"positive_ctxs": [{"passage_id": "1", "title": "T"}]}, "positive_ctxs[0].text", "missing"),
        ({"hard_negative_ctxs": [{"passage_id": "1", "title": "T", "text": ""}]}, "hard_negative_ctxs[0].text", "empty"),
        ({"negative_ctxs": [{"passage_id": None, "title": "T", "text": "x"}]}, "negative_ctxs[0].passage_id", "expected a string"),
        ({"positive_ctxs": [{"passage_id": "1", "title": 5, "text": "x"}]}, "positive_ctxs[0].title", "expected a string"),
        ({"qrels": ["d1"]}, "qrels", "expected an object"),
        ({"qrels": {"d1": 1, "d2": "2"}}, "qrels.d2", "not an integer"),
    ],
)
def test_retriever_json_bad_record(tmp_path, bad, field, word):
    path = _write(tmp_path, "dev.json", json.dumps([_ex(), _ex(**bad)]))
    _raises(read_retriever_json, path, "record 1", field, word)


def test_retriever_json_missing_field_and_not_a_list(tmp_path):
    ex = _ex()
    del ex["positive_ctxs"]
    _raises(read_retriever_json, _write(tmp_path, "a.json", json.dumps([ex])), "record 0", "positive_ctxs", "missing")
    _raises(read_retriever_json, _write(tmp_path, "b.json", json.dumps({"data": []})), None, None, "expected a JSON list")


def test_retriever_json_writer_validates(tmp_path):
    with pytest.raises(DataError, match="record 0: field 'question'"):
        write_retriever_json(tmp_path / "out.json", [_ex(question="")])
    assert not (tmp_path / "out.json").exists()


# --- BEIR -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "content, line, field, word",
    [
        ('{"_id": "d1", "title": "", "text": "x"}\n{"_id": "d2", "text": "y"\n', 2, None, "broken JSON"),
        ('{"_id": "d1", "title": "", "text": "x"}\n{"title": "", "text": "y"}\n', 2, "_id", "missing"),
        ('{"_id": "d1", "title": "", "text": "x"}\n{"_id": "d1", "title": "", "text": "y"}\n', 2, "_id", "duplicate document id"),
        ('{"_id": "d1", "title": "", "text": "x"}\n{"_id": "d2", "title": "", "text": ""}\n', 2, "text", "empty text and title"),
        ('{"_id": "d1", "title": "", "text": ["x"]}\n', 1, "text", "expected a string"),
        ('["not", "an", "object"]\n', 1, None, "expected a JSON object"),
    ],
)
def test_beir_corpus_bad(tmp_path, content, line, field, word):
    _raises(iter_beir_corpus, _write(tmp_path, "corpus.jsonl", content), line, field, word)


def test_beir_queries_bad(tmp_path):
    _raises(read_queries, _write(tmp_path, "q1.jsonl", '{"_id": "q1", "text": "a"}\n{"_id": "q2", "text": ""}\n'), 2, "text", "empty")
    _raises(read_queries, _write(tmp_path, "q2.jsonl", '{"_id": "q1", "text": "a"}\n{"_id": "q1", "text": "b"}\n'), 2, "_id", "duplicate")
    _raises(read_queries, _write(tmp_path, "q3.jsonl", b'{"_id": "q1", "text": "a"}\n{"_id": "q2", "text": "\xc3("}\n'), 2, None, "not UTF-8")


@pytest.mark.parametrize(
    "content, line, field, word",
    [
        ("query-id\tdoc-id\tscore\r\nq1\td1\t1\r\n", 1, "header", "expected header"),
        ("q1\td1\t1\n", 1, "header", "expected header"),
        ("query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\nq1\td2\thigh\r\n", 3, "score", "not an integer"),
        ("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t2\n", 3, "corpus-id", "listed twice"),
        ("query-id\tcorpus-id\tscore\nq1\td1\n", 2, "query-id", "3 tab-separated"),
        ("query-id\tcorpus-id\tscore\nq1\td1\t1\nq9\td1\t1\n", 3, "query-id", "unknown query id 'q9'"),
        ("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td9\t1\n", 3, "corpus-id", "unknown corpus id 'd9'"),
    ],
)
def test_qrels_bad(tmp_path, content, line, field, word):
    path = _write(tmp_path, "test.tsv", content)
    _raises(lambda p: read_qrels(p, query_ids={"q1"}, doc_ids={"d1", "d2"}), path, line, field, word)


# --- results and TREC runs ------------------------------------------------------------------------

def _res(**ctx_over):
    ctx = {"id": "p1", "title": "T", "text": "x", "score": 1.0, "has_answer": False}
    ctx.update(ctx_over)
    return {"question": "q", "answers": ["a"], "ctxs": [ctx]}


@pytest.mark.parametrize(
    "ctx_over, field, word",
    [
        ({"score": "high"}, "ctxs[0].score", "expected a number"),
        ({"score": None}, "ctxs[0].score", "expected a number"),
        ({"has_answer": "yes"}, "ctxs[0].has_answer", "true/false"),
        ({"id": ""}, "ctxs[0].id", "empty"),
    ],
)
def test_results_bad_ctx(tmp_path, ctx_over, field, word):
    path = _write(tmp_path, "results.json", json.dumps([_res(), _res(**ctx_over)]))
    _raises(read_results, path, "record 1", field, word)


def test_results_missing_ctxs(tmp_path):
    path = _write(tmp_path, "results.json", json.dumps([{"question": "q", "answers": []}]))
    _raises(read_results, path, "record 0", "ctxs", "missing")


def test_trec_run_bad(tmp_path):
    _raises(read_trec_run, _write(tmp_path, "a.trec", "q1 Q0 d1 1 2.0 tag\nq1 Q0 d2 2 tag\n"), 2, "qid", "6 fields")
    _raises(read_trec_run, _write(tmp_path, "b.trec", "q1 Q0 d1 1 2.0 tag\nq1 Q0 d2 2 x tag\n"), 2, "score", "not a number")
    _raises(read_trec_run, _write(tmp_path, "c.trec", "q1 Q0 d1 1 2.0 tag\nq1 Q0 d1 2 1.0 tag\n"), 2, "docid", "twice")


# --- SQuAD, SciQ, NQ-open -------------------------------------------------------------------------

def _squad(answer_start: int = 12, context: str = "Paris is in France.") -> dict:
    return {"version": "1.1", "data": [{"title": "Paris", "paragraphs": [{"context": context, "qas": [
        {"id": "q1", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": answer_start}]}]}]}]}


def test_squad_answer_span_outside_context(tmp_path):
    path = _write(tmp_path, "dev-v1.1.json", json.dumps(_squad(answer_start=3)))
    _raises(read_squad, path, "record data[0].paragraphs[0].qas[0].answers[0]", "answer_start", "answer span outside its context")
    path = _write(tmp_path, "dev2.json", json.dumps(_squad(answer_start=40)))
    _raises(read_squad, path, "record data[0].paragraphs[0].qas[0].answers[0]", "answer_start", "outside")


def test_squad_missing_and_wrong_type(tmp_path):
    bad = _squad()
    del bad["data"][0]["paragraphs"][0]["context"]
    _raises(read_squad, _write(tmp_path, "a.json", json.dumps(bad)), "record data[0].paragraphs[0]", "context", "missing")
    bad = _squad()
    bad["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = "12"
    _raises(read_squad, _write(tmp_path, "b.json", json.dumps(bad)), "record data[0].paragraphs[0].qas[0].answers[0]", "answer_start", "integer")


def test_sciq_and_nq_open_bad(tmp_path):
    items = [{"question": "q", "correct_answer": "a", "support": ""}, {"question": "q2", "support": "s"}]
    _raises(read_sciq, _write(tmp_path, "train.json", json.dumps(items)), "record 1", "correct_answer", "missing")
    content = '{"question": "q", "answer": ["a"]}\n{"question": "q2", "answer": "a"}\n'
    _raises(read_nq_open, _write(tmp_path, "NQ-open.dev.jsonl", content), 2, "answer", "expected a list")
    content = '{"question": "q", "answer": []}\n'
    _raises(read_nq_open, _write(tmp_path, "nq2.jsonl", content), 1, "answer", "empty list")


# --- checksums ------------------------------------------------------------------------------------

def test_fetch_refuses_checksum_mismatch(tmp_path):
    """A mirror file whose bytes differ from the registry's digest is refused, naming expected and actual."""
    fake = tmp_path / "mirror" / "squad-v1.1" / "dev-v1.1.json"
    fake.parent.mkdir(parents=True)
    fake.write_text(json.dumps(_squad()))
    msg = _raises(lambda p: fetch("squad-dev-v1.1", tmp_path / "mirror"), fake, None, "sha256", "sha256 mismatch")
    assert "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9" in msg
    import hashlib

    assert hashlib.sha256(fake.read_bytes()).hexdigest() in msg


def test_fetch_missing_mirror_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="dev-v1.1.json"):
        fetch("squad-dev-v1.1", tmp_path)


# --- every command: one line, non-zero exit, before any work ---------------------------------------------

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

BIN = Path(sys.executable).parent

from tests.run_command import run_command  # noqa: E402


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # in-process (the console script's main): a refusal is what the command prints and returns; Ctrl-C below is
    # a real process, since the signal is the point there
    return run_command(args, cwd=cwd)


def _one_line(proc: subprocess.CompletedProcess, *words: str, rc: int = 2) -> str:
    # progress bars (datasets, tqdm) may precede it on stderr; the error itself is one line, the last
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("dpr-")]
    assert proc.returncode == rc and len(lines) == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == lines[0] and "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _results(tmp_path: Path) -> Path:
    path = tmp_path / "res.json"
    path.write_text(json.dumps([{"question": "q", "answers": ["a"], "ctxs": [
        {"id": "p1", "title": "t", "text": "a b", "score": 1.0, "has_answer": True}]}]))
    return path


def test_missing_model_path_is_named(tmp_path, tiny_data_dir):
    missing = tmp_path / "runs" / "no" / "model"
    proc = _cli("dpr-encode", f"model={missing}", f"passages={tiny_data_dir / 'tiny' / 'passages.tsv'}",
                f"output_dir={tmp_path / 'emb'}")
    _one_line(proc, "model not found", str(missing))
    assert not (tmp_path / "emb").exists()


def test_unwritable_output_refused_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = _cli("dpr-eval", f"results=[{_results(tmp_path)}]", f"output_dir={blocker / 'eval'}")
    _one_line(proc, "output_dir", "not a directory")
    proc = _cli("dpr-index", f"embeddings={tmp_path / 'none'}", f"output={blocker / 'index.faiss'}")
    _one_line(proc, "output", "not a directory")  # before: the missing embeddings, i.e. after reading
    proc = _cli("dpr-train", "data=squad1_open", f"output_dir={blocker / 'run'}")
    _one_line(proc, "output_dir", "not a directory")  # before: Hydra's traceback from mkdir


def test_answers_nested_deep_is_one_data_error(tmp_path):
    path = _write(tmp_path, "deep.qa.tsv", "question\t" + "[" * 100000 + "\n")
    _raises(read_qa_tsv, path, 1, "answers", "nested too deeply")
    deep = _write(tmp_path, "deep.json", "[" * 100000)
    _raises(read_retriever_json, deep, None, None, "nested too deeply")


def test_eval_resamples_zero_refused(tmp_path):
    _one_line(_cli("dpr-eval", f"results=[{_results(tmp_path)}]", f"output_dir={tmp_path / 'e'}", "resamples=0"),
              "config key resamples: 0 is out of range; allowed: [1, 1000000]")


def test_bad_passages_surface_the_data_error(tmp_path, tiny_model_dir):
    from dpr.data.passages import load_passages

    bad = _write(tmp_path, "psgs.tsv", "id\ttext\ttitle\n1\tsome text\tT\n2\tonly two fields\n")
    _raises(lambda p: load_passages(p, cache_dir=tmp_path / "cache"), bad, 3, "id", "3 tab-separated")
    proc = _cli("dpr-encode", f"model={tiny_model_dir}", f"passages={bad}", f"output_dir={tmp_path / 'emb'}")
    _one_line(proc, f"{bad}:3:", "field 'id'")


def test_degenerate_values_refused(tmp_path, tiny_data_dir, tiny_model_dir):
    tiny = tiny_data_dir / "tiny"
    _one_line(_cli("dpr-retrieve", f"model={tiny_model_dir}", f"index={tmp_path / 'i.faiss'}", "k=0",
                   f"passages={tiny / 'passages.tsv'}", f"qa={tiny / 'test.qa.tsv'}", f"output={tmp_path / 'o.json'}"),
              "config key k: 0 is out of range")
    _one_line(_cli("dpr-bm25", "data=squad1_open", "data.name=tiny", f"data_dir={tiny_data_dir}", "k=0",
                   f"output={tmp_path / 'b.json'}"), "config key k: 0 is out of range")
    empty = _write(tmp_path, "empty.qa.tsv", "")
    index = tmp_path / "i.faiss"
    index.write_bytes(b"")  # never read: the empty question set is refused first (no metadata: not checkable)
    _one_line(_cli("dpr-retrieve", f"model={tiny_model_dir}", f"index={index}",
                   f"passages={tiny / 'passages.tsv'}", f"qa={empty}", f"output={tmp_path / 'o.json'}"),
              "no questions")
    _one_line(_cli("dpr-bm25", f"passages={tiny / 'passages.tsv'}", f"qa={empty}", f"output={tmp_path / 'b.json'}"),
              "no questions")
    train = ["dpr-train", "data=squad1_open", "data.name=tiny", f"data_dir={tiny_data_dir}",
             f"model.name={tiny_model_dir}", f"output_dir={tmp_path / 'run'}"]
    _one_line(_cli(*train, "train.max_steps=0", "train.epochs=0"), "zero training steps")
    _one_line(_cli(*train, "train.max_steps=0", "train.epochs=1", "train.batch_size=64"), "zero steps per epoch")
    assert not (tmp_path / "run" / "biencoder.json").exists()
    assert not (tmp_path / "o.json").exists() and not (tmp_path / "b.json").exists()


def test_unexpected_error_is_one_line_and_a_log_file(tmp_path, monkeypatch, capsys):
    from dpr.cli.common import report_errors

    @report_errors("dpr-x")
    def f():
        return {}["boom"]

    monkeypatch.setenv("DPR_LOG_DIR", str(tmp_path / "logs"))
    with pytest.raises(SystemExit) as exc:
        f()
    proc = subprocess.CompletedProcess([], exc.value.code, "", capsys.readouterr().err)
    line = _one_line(proc, "unexpected error: KeyError", "traceback in", rc=1)
    log = Path(line.rsplit("traceback in ", 1)[1])
    assert log.parent == tmp_path / "logs" and "Traceback" in log.read_text() and "boom" in log.read_text()


def test_ctrl_c_is_one_line(tmp_path, tiny_model_dir):
    words = " ".join(f"w{i}" for i in range(60))
    passages = _write(tmp_path, "p.tsv", "id\ttext\ttitle\n" + "".join(f"p{i}\t{words} {i}\tT\n" for i in range(3000)))
    out = tmp_path / "emb"
    proc = subprocess.Popen([str(BIN / "dpr-encode"), f"model={tiny_model_dir}", f"passages={passages}",
                             f"output_dir={out}", "batch_size=8", "device=cpu"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "WANDB_MODE": "disabled"},
                            # a shell running the suite in the background leaves SIGINT ignored, and Python then
                            # installs no KeyboardInterrupt handler: restore the default, as a terminal would have it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    end = time.monotonic() + 120
    while not any(out.glob(".shard_*.tmp")) and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == "dpr-encode: interrupted"


@pytest.mark.parametrize("cmd, args, words", [
    ("dpr-retrieve", ["k=abc"], ["config key k:", "Integer"]),
    ("dpr-retrieve", ["+topk=5"], ["config key topk: unknown", "known keys"]),
    ("dpr-index", ["index=ivfpq", "index.nprobe=x"], ["config key index.nprobe:"]),
    ("dpr-encode", ["model=m", "passages=p", "batch_size=big"], ["config key batch_size:"]),
    ("dpr-eval", ["results=[r]", "resamples=1.5"], ["config key resamples:"]),
    ("dpr-bm25", ["data=squad1_open", "k1=high"], ["config key k1:", "Float"]),
    ("dpr-data", ["data=squad1_open", "data.seed=x"], ["config key data.seed:"]),
    ("dpr-train", ["model.temperature=abc"], ["config key model.temperature:", "Float"]),
    ("dpr-train", ["+model.tempx=1"], ["config key model.tempx: unknown"]),
    ("dpr-encode", ["model=m"], ["config key output_dir: required", "also missing: passages"]),
    ("dpr-index", [], ["config key embeddings: required"]),
    # Hydra's own composition errors (several lines before): one line too
    ("dpr-retrieve", ["topk=5"], ["Could not override 'topk'", "+topk=5"]),
    ("dpr-data", ["data=nope"], ["Could not find 'data/nope'", "squad1_open"]),
    ("dpr-train", ["train=nope"], ["Could not find 'train/nope'"]),
    ("dpr-pipeline", ["remine.dept=5"], ["Could not override 'remine.dept'"]),
    ("dpr-pipeline", ["remine.depth=abc"], ["remine.depth must be an integer", "'abc'"]),
    # the re-mining keys left train (remine.*; train.rounds is dpr-pipeline's alone)
    ("dpr-pipeline", ["train.remine_depth=5"], ["config key train.remine_depth: unknown", "use remine.depth"]),
    ("dpr-train", ["train.rounds=2"], ["config key train.rounds: unknown", "dpr-pipeline train.rounds=N"]),
])
def test_config_values_are_type_checked(tmp_path, cmd, args, words):
    out = {"dpr-retrieve": ["output=o.json"], "dpr-index": ["embeddings=e", "output=i.faiss"] if args else [],
           "dpr-encode": [] if args == ["model=m"] else ["output_dir=e"], "dpr-eval": ["output_dir=e"], "dpr-train": [f"output_dir={tmp_path / 'run'}"]}
    _one_line(_cli(cmd, *args, *out.get(cmd, []), cwd=tmp_path), *words)


def test_unknown_qrels_document_ids_refused(tmp_path, tiny_data_dir):
    from dpr.data.beir import check_qrels_corpus

    passages = tiny_data_dir / "tiny" / "passages.tsv"
    qrels = _write(tmp_path, "qrels.tsv", "query-id\tcorpus-id\tscore\nq1\tp1\t1\nq2\tp99\t1\n")
    _raises(lambda p: check_qrels_corpus(p, passages), qrels, 3, "corpus-id", "unknown corpus id 'p99'")
    queries = _write(tmp_path, "queries.jsonl", '{"_id": "q1", "text": "capital"}\n{"_id": "q2", "text": "x"}\n')
    proc = _cli("dpr-bm25", f"passages={passages}", f"queries={queries}", f"qrels={qrels}",
                f"output={tmp_path / 'run.trec'}")
    _one_line(proc, f"{qrels}:3:", "field 'corpus-id'", "p99")
    assert not (tmp_path / "run.trec").exists()

