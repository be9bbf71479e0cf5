"""No bad number gets through: fusion weights, index parameters, max lengths and broken model files are each
refused with one line naming the argument or file."""

from __future__ import annotations

import errno
import json
import math
import shutil
import subprocess
from pathlib import Path

import faiss
import numpy as np
import pytest

from dpr.errors import DataError
from dpr.retrieval.fusion import fuse_linear, fuse_ranked, fuse_rrf, tune_linear_weight
from dpr.index import build_index, load_index, save_index, search
from dpr.index.shards import write_shard
from dpr.retrieval.runs import hybrid_retrieve

from tests.data.test_bad_input import _cli, _one_line

BAD_WEIGHTS = [math.nan, math.inf, -math.inf, 1e308, -1.0, 1e6 * 1.0001]


# --- fusion weights ---------------------------------------------------------------------------------

def _results(scores: list[list[tuple[str, float]]], hit: str = "p1") -> list[dict]:
    return [{"question": f"q{i}", "answers": ["a"],
             "ctxs": [{"id": p, "title": "", "text": "", "score": s, "has_answer": p == hit} for p, s in row]}
            for i, row in enumerate(scores)]


BM25 = _results([[("p1", 12.0), ("p2", 9.0), ("p3", 3.0)], [("p2", 20.0), ("p1", 1.0)]])
DENSE = _results([[("p3", 0.9), ("p1", 0.8), ("p4", 0.1)], [("p1", 0.7), ("p4", 0.2)]])


@pytest.mark.parametrize("weight", BAD_WEIGHTS)
def test_bad_fusion_weight_refused_everywhere(weight, tmp_path):
    for call in (lambda: fuse_ranked([("a", 1.0)], [("b", 1.0)], 5, weight=weight),
                 lambda: fuse_linear(BM25, DENSE, weight, tmp_path / "o.json"),
                 lambda: tune_linear_weight(BM25, DENSE, grid=[0.5, weight]),
                 lambda: hybrid_retrieve(tmp_path / "missing.json", tmp_path / "missing2.json", tmp_path / "o.json",
                                         weight=weight)):
        with pytest.raises(ValueError, match=r"(weight|grid\[1\]) must be a finite number \[0, 1e\+06\]") as info:
            call()
        assert "\n" not in str(info.value)
    assert not (tmp_path / "o.json").exists()  # checked before any file is read or written


def test_largest_weight_is_finite_and_ranks_by_bm25():
    with pytest.raises(ValueError, match="weight"):
        fuse_linear(BM25, DENSE, 1.0000001e6, normalize="none")  # the bound is sharp
    fused = fuse_linear(BM25, DENSE, 1e6, normalize="none")  # raw scores: the bound keeps the product finite
    assert all(math.isfinite(c["score"]) for r in fused for c in r["ctxs"])
    assert [c["id"] for c in fused[0]["ctxs"]][:3] == ["p1", "p2", "p3"]
    ranked = fuse_ranked([("a", 3e38)], [("b", 1.0)], 2, weight=1e6, normalize="none")
    assert all(math.isfinite(s) for _, s in ranked)


@pytest.mark.parametrize("k_rrf", [math.nan, -1.0, math.inf])
def test_bad_k_rrf_and_k_refused(k_rrf):
    with pytest.raises(ValueError, match="k_rrf"):
        fuse_rrf(BM25, DENSE, k_rrf=k_rrf)
    with pytest.raises(TypeError, match="k must be an integer, got float 2.5"):
        fuse_linear(BM25, DENSE, 0.5, k=2.5)


@pytest.mark.parametrize("arg, key", [("weight=nan", "weight"), ("weight=1e308", "weight"), ("weight=-1", "weight"),
                                      ("grid=[0.1,inf]", "grid[1]"), ("k_rrf=-60", "k_rrf")])
def test_cli_fusion_weight_one_line(tmp_path, arg, key):
    (tmp_path / "b.json").write_text(json.dumps(BM25))
    (tmp_path / "d.json").write_text(json.dumps(DENSE))
    proc = _cli("dpr-retrieve", "mode=hybrid", f"bm25={tmp_path / 'b.json'}", f"dense={tmp_path / 'd.json'}",
                f"bm25_dev={tmp_path / 'b.json'}", f"dense_dev={tmp_path / 'd.json'}", *(["fusion=rrf"] if
                key == "k_rrf" else []), f"output={tmp_path / 'o.json'}", arg)
    _one_line(proc, f"config key {key}:", "out of range", "allowed: [0, 1e+06]")
    assert not (tmp_path / "o.json").exists()


def test_pipeline_fusion_grid_checked_before_any_work(tmp_path):
    proc = _cli("dpr-pipeline", "data=squad1_open", f"data_dir={tmp_path / 'data'}", f"output_dir={tmp_path / 'run'}",
                "hybrid.grid=[0.5,nan]")
    _one_line(proc, "config key hybrid.grid[1]: nan is out of range")
    proc = _cli("dpr-pipeline", "data=squad1_open", f"data_dir={tmp_path / 'data'}", f"output_dir={tmp_path / 'run'}",
                "hybrid.k_rrf=-1")
    _one_line(proc, "config key hybrid.k_rrf: -1")
    assert not (tmp_path / "data").exists() and not (tmp_path / "run").exists()


# --- FAISS factory strings and index parameters -----------------------------------------------------

@pytest.mark.parametrize("factory, words", [
    ("HNSW0", "HNSW M=0 must be in [2, 256]"), ("HNSW1", "HNSW M=1"), ("IVF0,Flat", "nlist=0 must be >= 1"),
    ("IVF4,PQ8x0", "PQ bits=0"), ("IVF4,PQ8x17", "PQ bits=17"), ("IVF4,PQ0", "PQ m=0"),
    ("LSH", "not a supported form"), ("HNSW32,PQ8", "not a supported form"), ("IVF{nlist}", "not a supported form"),
    ("", "not a supported form"),
])
def test_factory_parser_refuses(factory, words):
    from dpr.index.factory import SUPPORTED, parse_factory

    with pytest.raises(ValueError) as info:
        parse_factory(factory)
    msg = str(info.value)
    assert words in msg and "\n" not in msg and f"index.factory {factory!r}" in msg
    if "supported form" in words:
        assert SUPPORTED in msg


@pytest.mark.parametrize("factory", ["Flat", "HNSW32", "HNSW16,Flat", "IVF{nlist},Flat", "IVF{nlist},PQ{m}",
                                     "IVF4096,PQ64", "IVF4,PQ8x4", "OPQ64,IVF4096,PQ64", "OPQ16_64,IVF8,PQ16"])
def test_factory_parser_accepts_what_the_project_uses(factory):
    from dpr.index.factory import parse_factory

    assert parse_factory(factory).text == factory


@pytest.fixture()
def emb(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((300, 16)).astype(np.float32)
    write_shard(tmp_path / "emb", 0, 1, vecs, [f"p{i}" for i in range(300)], start=0, end=300, total=300,
                model="m", model_fingerprint="f", passages_sha256="s", dtype="float32")
    return tmp_path / "emb"


@pytest.mark.parametrize("params, words", [
    (dict(factory="HNSW0"), "HNSW M=0"), (dict(factory="IVF{nlist},Flat", nlist=0), "index.nlist must be"),
    (dict(factory="IVF{nlist},PQ{m}", m=0), "index.m must be"), (dict(train_sample=0), "index.train_sample"),
    (dict(factory="HNSW8", ef_search=-1), "ef_search must be"), (dict(nprobe=0), "nprobe must be"),
    (dict(ef_construction=0), "index.ef_construction"), (dict(add_batch_size=0), "index.add_batch_size"),
])
def test_build_index_refuses_bad_parameters_before_faiss(tmp_path, params, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[")):
        build_index(tmp_path / "no-embeddings", **params)  # refused before the shards are even looked at


@pytest.mark.parametrize("arg, words", [
    ("index.factory=HNSW0", "HNSW M=0"), ("index.factory=LSHx", "not a supported form"),
    ("index.ef_search=-1", "config key index.ef_search: -1 is out of range"),
    ("index.nlist=0", "config key index.nlist: 0"), ("index.m=0", "config key index.m: 0"),
    ("index.train_sample=0", "config key index.train_sample: 0"), ("index.nprobe=0", "config key index.nprobe: 0"),
])
def test_cli_index_parameters_one_line(emb, tmp_path, arg, words):
    out = tmp_path / "i.faiss"
    proc = _cli("dpr-index", f"embeddings={emb}", f"output={out}", "index=hnsw" if "ef_search" in arg else "index=ivfpq",
                arg)
    _one_line(proc, words)  # before: HNSW0 aborted inside faiss (exit 134), LSHx was an "unexpected error"
    assert not out.exists()


def test_saved_bad_ef_search_is_refused_not_short(emb, tmp_path):
    """An index saved with efSearch=-1 (before the checks) returned 1 passage per question instead of k."""
    index, ids = build_index(emb, factory="HNSW8")
    faiss.downcast_index(index).hnsw.efSearch = -1
    save_index(index, ids, tmp_path / "old.faiss")
    with pytest.raises(DataError, match="ef_search=-1") as info:
        load_index(tmp_path / "old.faiss")
    assert str(tmp_path / "old.faiss") in str(info.value) and "give ef_search=" in str(info.value)
    fixed, ids = load_index(tmp_path / "old.faiss", ef_search=32)
    hits, _ = search(fixed, ids, np.random.default_rng(1).standard_normal((4, 16)), k=20, progress=False)
    assert [len(h) for h in hits] == [20] * 4


def test_saved_bad_nprobe_is_refused(emb, tmp_path):
    index, ids = build_index(emb, factory="IVF4,Flat")
    faiss.extract_index_ivf(index).nprobe = 0
    save_index(index, ids, tmp_path / "old.faiss")
    with pytest.raises(DataError, match="nprobe=0"):
        load_index(tmp_path / "old.faiss")
    assert load_index(tmp_path / "old.faiss", nprobe=2)[0].ntotal == 300


# --- max_length -------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_length, exc, words", [
    (0, ValueError, "max_length must be an integer [1, "), (-5, ValueError, "got -5"),
    (257, ValueError, "[1, 256] (the model's max_position_embeddings), got 257"), (2.5, TypeError, "got float 2.5"),
])
def test_encode_max_length_in_model_range(tiny_model_dir, tiny_data_dir, tmp_path, max_length, exc, words):
    from tests.encode_kw import encode_corpus  # the keyword form: settings split into EncodeConfig

    out = tmp_path / "emb"
    with pytest.raises(exc) as info:
        encode_corpus(tiny_model_dir, tiny_data_dir / "tiny" / "passages.tsv", out, max_length=max_length,
                      device="cpu", runtime="torch", autocast="off", progress=False)
    assert words in str(info.value)
    assert not list(out.glob("shard_*")) if out.exists() else True


def test_encode_max_length_at_the_limit_works(tiny_model_dir, tiny_data_dir, tmp_path):
    from tests.encode_kw import encode_corpus  # the keyword form: settings split into EncodeConfig
    from dpr.index.shards import read_embeddings

    with pytest.raises(ValueError, match="got 257"):  # the bound is sharp: one more is refused
        encode_corpus(tiny_model_dir, tiny_data_dir / "tiny" / "passages.tsv", tmp_path / "emb", max_length=257,
                      device="cpu", runtime="torch", autocast="off", dtype="float32", progress=False)
    out = encode_corpus(tiny_model_dir, tiny_data_dir / "tiny" / "passages.tsv", tmp_path / "emb", max_length=256,
                        device="cpu", runtime="torch", autocast="off", dtype="float32", progress=False)
    ids, vecs = read_embeddings(out)
    assert len(ids) == 8 and np.isfinite(vecs).all()


@pytest.mark.parametrize("value", ["0", "-5"])
def test_cli_encode_max_length_one_line(tiny_model_dir, tiny_data_dir, tmp_path, value):
    proc = _cli("dpr-encode", f"model={tiny_model_dir}", f"passages={tiny_data_dir / 'tiny' / 'passages.tsv'}",
                f"output_dir={tmp_path / 'emb'}", f"max_length={value}")
    _one_line(proc, f"config key max_length: {value} is out of range")
    assert not (tmp_path / "emb").exists()


def test_cli_encode_max_length_above_positions_one_line(tiny_model_dir, tiny_data_dir, tmp_path):
    proc = _cli("dpr-encode", f"model={tiny_model_dir}", f"passages={tiny_data_dir / 'tiny' / 'passages.tsv'}",
                f"output_dir={tmp_path / 'emb'}", "max_length=100000", "runtime=torch")
    _one_line(proc, "max_length must be an integer [1, 256] (the model's max_position_embeddings), got 100000")
    assert not list((tmp_path / "emb").glob("shard_*"))


# --- broken model files and full disks ----------------------------------------------------------------

def _truncated_copy(model_dir: Path, dest: Path) -> Path:
    shutil.copytree(model_dir, dest)
    weights = dest / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return weights


def test_truncated_safetensors_is_one_line_naming_the_file(tiny_model_dir, tiny_data_dir, tmp_path):
    weights = _truncated_copy(tiny_model_dir, tmp_path / "model")
    proc = _cli("dpr-encode", f"model={tmp_path / 'model'}", f"passages={tiny_data_dir / 'tiny' / 'passages.tsv'}",
                f"output_dir={tmp_path / 'emb'}")
    _one_line(proc, str(weights), "truncated or corrupt safetensors file")  # before: "unexpected error" (rc 1)
    assert not (tmp_path / "emb").exists()


def test_corrupt_safetensors_header_named(tiny_model_dir, tmp_path):
    from dpr.cli.common import check_model_path

    shutil.copytree(tiny_model_dir, tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:16] = b"\xff" * 8  # garbage in the JSON header
    weights.write_bytes(bytes(data))
    with pytest.raises(DataError, match="corrupt safetensors file") as info:
        check_model_path(str(tmp_path / "model"))
    assert str(weights) in str(info.value)


def test_safetensors_error_from_the_loader_is_expected_and_names_the_file(tiny_model_dir, tmp_path, capsys):
    """Through the Python API there is no pre-check: the loader's own SafetensorError is still one line with
    the file, exit 2 (it was an "unexpected error", exit 1)."""
    from dpr.cli.common import report_errors
    from dpr.models import load_biencoder

    weights = _truncated_copy(tiny_model_dir, tmp_path / "model")
    with pytest.raises(SystemExit) as exc:
        report_errors("dpr-x")(lambda: load_biencoder(str(tmp_path / "model")))()
    proc = subprocess.CompletedProcess([], exc.value.code, "", capsys.readouterr().err)
    _one_line(proc, "dpr-x: error:", str(weights), "corrupt or truncated safetensors file")


def _run_dir(tiny_model_dir: Path, out: Path) -> Path:
    from dpr.models import BiEncoderConfig, build_biencoder, save_biencoder

    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), pooling="mean"))
    save_biencoder(model, tok, out)
    return out


@pytest.mark.parametrize("how", ["safetensors", "oserror"])
def test_disk_full_during_export_is_one_line_and_leaves_nothing(tiny_model_dir, tmp_path, monkeypatch, capsys, how):
    import safetensors.torch
    from safetensors import SafetensorError

    from dpr.cli.common import report_errors
    from dpr.export import export_sentence_transformers

    run = _run_dir(tiny_model_dir, tmp_path / "run")

    def full(tensors, filename, *args, **kwargs):
        if how == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')

    import transformers.modeling_utils as mu

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    monkeypatch.setattr(mu, "safe_save_file", full, raising=False)
    out = tmp_path / "exports" / "st"
    out.parent.mkdir()
    with pytest.raises(SystemExit) as info:
        report_errors("dpr-export")(lambda: export_sentence_transformers(run, out))()
    assert info.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("dpr-")]  # progress bars aside
    assert len(err) == 1 and err[0].startswith("dpr-export: error:") and "disk full" in err[0], err
    if how == "safetensors":
        assert ".safetensors" in err[0]  # the file it was writing
    assert list(out.parent.iterdir()) == []  # no half-written export, no temp directory left behind
