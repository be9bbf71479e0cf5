"""`from dpr import Retriever`: BM25, dense and hybrid search equal what the CLI commands write."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpr.data.results import read_results

from tests.conftest import TINY_PASSAGES, TINY_QA, write_tiny_dataset
from tests.run_command import run_command

BIN = Path(sys.executable).parent
QUESTIONS = [q for q, _, _ in TINY_QA]


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = run_command(cmd, cwd=cwd)  # the console script's main, in-process
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def cli_results(tiny_model_dir, tmp_path_factory):
    """BM25, dense and hybrid results of the tiny test questions, written by the console scripts."""
    root = tmp_path_factory.mktemp("api")
    data = write_tiny_dataset(root / "data" / "tiny")
    psg, qa = data / "passages.tsv", data / "test.qa.tsv"
    run(["dpr-encode", f"model={tiny_model_dir}", f"passages={psg}", f"output_dir={root / 'emb'}",
         "dtype=float32", "autocast=off"], cwd=root)
    run(["dpr-index", f"embeddings={root / 'emb'}", f"output={root / 'index.faiss'}", "index=flat"], cwd=root)
    run(["dpr-bm25", f"passages={psg}", f"qa={qa}", f"output={root / 'bm25.json'}", "k=8"], cwd=root)
    run(["dpr-retrieve", f"model={tiny_model_dir}", f"index={root / 'index.faiss'}", f"passages={psg}", f"qa={qa}",
         f"output={root / 'dense.json'}", "k=8", "autocast=off"], cwd=root)
    run(["dpr-retrieve", "mode=hybrid", f"bm25={root / 'bm25.json'}", f"dense={root / 'dense.json'}", "weight=0.5",
         f"output={root / 'hybrid.json'}", "k=5"], cwd=root)
    run(["dpr-retrieve", "mode=hybrid", "fusion=rrf", f"bm25={root / 'bm25.json'}", f"dense={root / 'dense.json'}",
         f"output={root / 'rrf.json'}", "k=5"], cwd=root)
    return root, psg


def assert_same(hits_per_question, results, k):
    assert len(hits_per_question) == len(results) == len(QUESTIONS)
    text_of = {pid: (text, title) for pid, text, title in TINY_PASSAGES}
    for hits, res in zip(hits_per_question, results):
        assert len(hits) == len(res["ctxs"]) == k
        assert [h.id for h in hits] == [c["id"] for c in res["ctxs"]]
        np.testing.assert_allclose([h.score for h in hits], [c["score"] for c in res["ctxs"]], rtol=1e-5, atol=1e-6)
        assert all((h.text, h.title) == text_of[h.id] for h in hits)


def test_import_from_package():
    import dpr
    from dpr import Retriever
    from dpr.retrieval import Retriever as direct

    assert Retriever is direct and "Retriever" in dpr.__all__
    with pytest.raises(AttributeError):
        dpr.NoSuchThing  # noqa: B018


def test_bm25_equals_cli(cli_results, tmp_path):
    from dpr import Retriever

    root, psg = cli_results
    bm25 = Retriever.bm25(psg, index_dir=tmp_path / "bm25_index")
    assert_same(bm25.search(QUESTIONS, k=8), read_results(root / "bm25.json"), 8)
    assert bm25.search("what is the capital of france", k=1)[0][0].id == "p2"
    # the cached index is reused and gives the same results
    again = Retriever.bm25(psg, index_dir=tmp_path / "bm25_index")
    assert again.search_ids(QUESTIONS, 3) == bm25.search_ids(QUESTIONS, 3)


def test_dense_equals_cli(cli_results, tiny_model_dir):
    from dpr import Retriever

    root, psg = cli_results
    dense = Retriever.dense(tiny_model_dir, root / "index.faiss", passages=psg, autocast="off")
    results = read_results(root / "dense.json")
    hits = dense.search(QUESTIONS, k=8)
    # a random tiny model scores near-ties: compare each passage's score, then the orders where scores differ
    for row, res in zip(hits, results):
        got = {h.id: h.score for h in row}
        want = {c["id"]: c["score"] for c in res["ctxs"]}
        assert set(got) == set(want)
        np.testing.assert_allclose([got[p] for p in want], list(want.values()), rtol=1e-5, atol=1e-6)
    no_text = Retriever.dense(tiny_model_dir, root / "index.faiss", autocast="off")
    assert [[p for p, _ in r] for r in no_text.search_ids(QUESTIONS, 8)] == [[h.id for h in r] for r in hits]
    with pytest.raises(ValueError, match="passages"):
        no_text.search(QUESTIONS, 2)


def test_hybrid_equals_cli(cli_results, tiny_model_dir):
    from dpr import Retriever

    root, psg = cli_results
    bm25 = Retriever.bm25(psg)
    dense = Retriever.dense(tiny_model_dir, root / "index.faiss", passages=psg, autocast="off")
    # the CLI fused top-8 lists (the whole corpus): the same depth here
    linear = Retriever.hybrid(bm25, dense, weight=0.5, depth=8)
    assert_same(linear.search(QUESTIONS, k=5), read_results(root / "hybrid.json"), 5)
    rrf = Retriever.hybrid(bm25, dense, fusion="rrf", depth=8)
    assert_same(rrf.search(QUESTIONS, k=5), read_results(root / "rrf.json"), 5)
    with pytest.raises(ValueError, match="weight"):
        Retriever.hybrid(bm25, dense)


def test_bad_arguments(cli_results):
    from dpr import Retriever

    _, psg = cli_results
    bm25 = Retriever.bm25(psg)
    with pytest.raises(ValueError, match="k must be"):
        bm25.search(QUESTIONS, k=0)
    with pytest.raises(ValueError, match="prebuilt"):
        Retriever.bm25(psg, index=bm25.index, k1=1.2)


def test_wrong_argument_types_and_values_are_one_clear_error(cli_results, tiny_model_dir):
    """search([123]) was "object of type 'int' has no len()" (dense) / "'int' object has no attribute 'lower'"
    (BM25); k=2.5 was accepted; k=nan a raw ValueError from int(); weight=nan wrote NaN scores."""
    import math

    from dpr import Retriever

    root, psg = cli_results
    bm25 = Retriever.bm25(psg)
    dense = Retriever.dense(tiny_model_dir, root / "index.faiss", passages=psg, autocast="off")
    hybrid = Retriever.hybrid(bm25, dense, weight=0.5, depth=8)
    for r in (bm25, dense, hybrid):
        for method in (r.search, r.search_ids):
            cases = [
                (([123], 3), TypeError, r"questions\[0\] must be a string, got int 123"),
                (("q", 2.5), TypeError, "k must be an integer, got float 2.5"),
                (("q", math.nan), TypeError, "k must be an integer, got float nan"),
                (("q", True), TypeError, "k must be an integer, got bool True"),
                (("q", 0), ValueError, r"k must be an integer \[1, 1000000\], got 0"),
                ((42, 3), TypeError, "questions must be a list of strings"),
            ]
            for args, exc, words in cases:
                with pytest.raises(exc, match=words) as info:
                    method(*args)
                assert "\n" not in str(info.value)
    for bad in (math.nan, math.inf, 1e308, -1):
        with pytest.raises(ValueError, match=r"weight must be a finite number \[0, 1e\+06\]"):
            Retriever.hybrid(bm25, dense, weight=bad)
    with pytest.raises(TypeError, match="weight must be a number, got str"):
        Retriever.hybrid(bm25, dense, weight="0.5")
    with pytest.raises(ValueError, match="k_rrf"):
        Retriever.hybrid(bm25, dense, fusion="rrf", k_rrf=math.nan)
    with pytest.raises(TypeError, match="depth must be an integer"):
        Retriever.hybrid(bm25, dense, weight=0.5, depth=1.5)
    with pytest.raises(TypeError, match="dense must be a Retriever"):
        Retriever.hybrid(bm25, "index.faiss", weight=0.5)
    for kw, words in [({"k1": math.nan}, "k1 must be a finite number"), ({"b": 2.0}, r"b must be a finite number \[0, 1\]"),
                      ({"n_threads": -2}, "n_threads must be an integer")]:
        with pytest.raises(ValueError, match=words):
            Retriever.bm25(psg, **kw)
    for kw, exc, words in [({"batch_size": 0}, ValueError, "batch_size"), ({"nprobe": 0}, ValueError, "nprobe"),
                           ({"ef_search": -1}, ValueError, "ef_search"), ({"max_length": 0}, ValueError, "max_length"),
                           ({"max_length": 257}, ValueError, r"max_length must be an integer \[1, 256\]"),
                           ({"search_batch_size": 1.5}, TypeError, "search_batch_size")]:
        with pytest.raises(exc, match=words):
            Retriever.dense(tiny_model_dir, root / "index.faiss", passages=psg, **kw)


def test_a_single_string_is_one_question(cli_results):
    from dpr import Retriever

    _, psg = cli_results
    bm25 = Retriever.bm25(psg)
    q = "what is the capital of france"
    assert bm25.search_ids(q, 3) == bm25.search_ids([q], 3) and len(bm25.search_ids(q, 3)) == 1
    assert [h.id for h in bm25.search(q, 3)[0]] == [p for p, _ in bm25.search_ids([q], 3)[0]]
    assert bm25.search_ids([], 3) == [] and bm25.search_ids((q,), 3) == bm25.search_ids([q], 3)


def test_hybrid_refuses_a_bm25_index_of_other_passages(cli_results, tiny_model_dir, tmp_path):
    """Fusing a BM25 index of one passages file with a dense index of another is refused in one line (before, it
    fused the two without a word, half the passages scored by one retriever only)."""
    from dpr import Retriever

    root, psg = cli_results
    other = tmp_path / "other.tsv"
    lines = psg.read_text(encoding="utf-8").splitlines()
    other.write_text("\n".join(lines[:-1]) + "\nextra1\tan extra passage about nothing\tExtra\n", encoding="utf-8")
    dense = Retriever.dense(tiny_model_dir, root / "index.faiss", passages=psg, autocast="off")
    with pytest.raises(ValueError, match=r"not the same passages \(1 only in BM25, 1 only in dense; e.g. 'extra1'") \
            as err:
        Retriever.hybrid(Retriever.bm25(other), dense, weight=0.5)
    assert "\n" not in str(err.value)
