"""Property-based fuzzing of every reader over random mutations of valid files (hypothesis).

Each mutated file either reads as valid records or raises the one-line `DataError` naming the file
(and, for line-based formats, the line); never any other exception. ``FUZZ_EXAMPLES`` cases per
reader keep the whole module at a few seconds; ``DPR_FUZZ_EXAMPLES=2000`` fuzzes harder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from dpr.data.beir import iter_beir_corpus, read_qrels, read_queries  # noqa: E402
from dpr.data.passages import iter_passages  # noqa: E402
from dpr.data.qa import read_qa_tsv  # noqa: E402
from dpr.data.results import read_results, read_trec_run  # noqa: E402
from dpr.data.retriever_json import read_retriever_json  # noqa: E402
from dpr.errors import DataError  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("DPR_FUZZ_EXAMPLES", "150"))
RAN: dict[str, int] = {}  # cases run per reader (printed at the end with -s)

CTX = {"passage_id": "p1", "title": "T", "text": "Honolulu is the capital"}
VALID: dict[str, bytes] = {
    "passages.tsv": b'id\ttext\ttitle\n1\tHonolulu is the capital\tHonolulu\n2\t"quoted ""x"" text"\tT\n3\tthird\t\n',
    "test.qa.tsv": b'what is the capital\t["Honolulu"]\nwho wrote it\t["A", "B"]\nthird q\t[\'x\']\n',
    "train.json": json.dumps([{"question": "q1", "answers": ["a"], "positive_ctxs": [CTX], "negative_ctxs": [],
                               "hard_negative_ctxs": [CTX]}, {"question": "q2", "answers": [], "positive_ctxs": [CTX],
                                                              "negative_ctxs": [], "hard_negative_ctxs": []}],
                             indent=1).encode(),
    "results.json": json.dumps([{"question": "q", "answers": ["a"], "ctxs": [
        {"id": "p1", "title": "t", "text": "a b", "score": 1.5, "has_answer": True},
        {"id": "p2", "title": "t", "text": "c", "score": 0.5, "has_answer": False}]}], indent=1).encode(),
    "corpus.jsonl": b'{"_id": "d1", "title": "T", "text": "one"}\n{"_id": "d2", "title": "", "text": "two"}\n',
    "queries.jsonl": b'{"_id": "q1", "text": "what"}\n{"_id": "q2", "text": "who"}\n',
    "qrels.tsv": b"query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t2\n",
    "run.trec": b"q1 Q0 d1 1 2.5 dpr\nq1 Q0 d2 2 1.5 dpr\nq2 Q0 d2 1 0.1 dpr\n",
}
LINE_BASED = {"passages.tsv", "test.qa.tsv", "corpus.jsonl", "queries.jsonl", "qrels.tsv", "run.trec"}
READERS: dict[str, Callable] = {
    "passages.tsv": lambda p: list(iter_passages(p)),
    "test.qa.tsv": read_qa_tsv,
    "train.json": read_retriever_json,
    "results.json": read_results,
    "corpus.jsonl": lambda p: list(iter_beir_corpus(p)),
    "queries.jsonl": read_queries,
    "qrels.tsv": read_qrels,
    "run.trec": read_trec_run,
}
SPECIAL = [b"\t", b"\n", b"\r\n", b'"', b"[", b"]", b"{", b"}", b",", b":", b"\x00", b"\xff", b"\xc3",
           b"nan", b"-1", b"1e999", b"null", b"[" * 3000, b" ", b"\ufeff".decode("latin-1").encode("latin-1")]


@st.composite
def mutations(draw, data: bytes) -> bytes:
    """A valid file with 1-4 random edits: byte flips, inserted specials or random bytes, deleted or
    duplicated spans, truncation."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(out)))
        op = draw(st.sampled_from(["flip", "insert_special", "insert_bytes", "delete", "duplicate", "truncate"]))
        if op == "flip" and pos < len(out):
            out[pos] = draw(st.integers(0, 255))
        elif op == "insert_special":
            out[pos:pos] = draw(st.sampled_from(SPECIAL))
        elif op == "insert_bytes":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            out[pos:pos + draw(st.integers(1, 12))] = b""
        elif op == "duplicate":
            end = min(len(out), pos + draw(st.integers(1, 40)))
            out[pos:pos] = out[pos:end]
        elif op == "truncate":
            del out[pos:]
    return bytes(out)


def _check(name: str, tmp_path: Path, content: bytes) -> None:
    RAN[name] = RAN.get(name, 0) + 1
    path = tmp_path / name
    path.write_bytes(content)
    try:
        READERS[name](path)
    except DataError as err:
        msg = str(err)
        assert "\n" not in msg and str(path) in msg, msg
        if name in LINE_BASED:
            assert err.line is not None, msg
    # anything else propagates and fails the property


@pytest.mark.parametrize("name", sorted(READERS))
def test_valid_file_reads(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(VALID[name])
    assert READERS[name](path)


@pytest.mark.parametrize("name", sorted(READERS))
def test_mutated_files_read_or_raise_one_line_data_error(tmp_path_factory, name):
    tmp = tmp_path_factory.mktemp("fuzz")

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(mutations(VALID[name]))
    def prop(content: bytes) -> None:
        _check(name, tmp, content)

    prop()
    assert RAN[name] >= min(FUZZ_EXAMPLES, 20)


def test_shard_manifests_mutated(tmp_path_factory):
    """A mutated shard manifest: the shard is taken as finished and consistent, or refused in one line."""
    from dpr.index.shards import ShardFiles, list_shards, write_shard

    base = tmp_path_factory.mktemp("shards")
    write_shard(base, 0, 1, np.ones((3, 4), dtype=np.float32), ["a", "b", "c"], start=0, end=3, total=3)
    valid = ShardFiles.of(base, 0, 1).manifest.read_bytes()

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(mutations(valid))
    def prop(content: bytes) -> None:
        RAN["shard manifest"] = RAN.get("shard manifest", 0) + 1
        ShardFiles.of(base, 0, 1).manifest.write_bytes(content)
        try:
            shards = list_shards(base)
        except DataError as err:
            assert "\n" not in str(err) and str(base) in str(err), str(err)
            return
        assert sum(s.count for s in shards) == shards[0].vectors().shape[0] == len(shards[0].ids())

    prop()


def test_zz_report_counts():
    """Printed with ``pytest -s``: how many fuzz cases ran per reader."""
    print("\nfuzz cases run:", json.dumps(RAN, sort_keys=True), "total", sum(RAN.values()))
