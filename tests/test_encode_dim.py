"""Matryoshka dimensions at encode and retrieval time: ``encode.dim`` writes each passage vector's first d coordinates
(re-normalised for a cosine model), recorded in the manifests; a mixed resume and an impossible size are one line;
retrieval over a truncated index cuts the questions alike and equals exact search over the truncated vectors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpr.errors import DataError
from dpr.index import build_and_save
from dpr.index.shards import list_shards, read_embeddings, write_shard
from dpr.models.truncate import truncate
from tests.conftest import TINY_QA
from tests.encode_kw import encode_corpus, save_encoded
from tests.run_command import run_as_subprocess

BIN = Path(sys.executable).parent
FP32 = dict(dtype="float32", autocast="off", runtime="torch", batch_size=4, progress=False)  # exact: fp32 throughout


@pytest.fixture(scope="module")
def cosine_run(tiny_model_dir, tmp_path_factory) -> Path:
    """A run directory of the tiny BERT with cosine similarity (the truncation re-normalises) and mean pooling."""
    from dpr.models import BiEncoderConfig, build_biencoder, save_biencoder

    out = tmp_path_factory.mktemp("cosine_run") / "run"
    torch.manual_seed(0)
    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), similarity="cosine", pooling="mean"))
    save_biencoder(model, tok, out)
    return out


def _passages(tiny_data_dir: Path) -> Path:
    return tiny_data_dir / "tiny" / "passages.tsv"


@pytest.mark.parametrize("cosine", [True, False])
def test_encode_dim_is_the_full_vectors_truncated(cosine, cosine_run, tiny_model_dir, tiny_data_dir, tmp_path):
    model = cosine_run if cosine else tiny_model_dir  # the HF directory: dot product, the prefix as is
    passages = _passages(tiny_data_dir)
    ids, full = read_embeddings(encode_corpus(model, passages, tmp_path / "full", num_shards=2, **FP32))
    out = encode_corpus(model, passages, tmp_path / "d16", num_shards=2, dim=16, **FP32)
    ids16, cut = read_embeddings(out)
    assert ids16 == ids and cut.shape == (len(ids), 16)
    want = truncate(torch.from_numpy(full), 16, cosine).numpy()
    np.testing.assert_allclose(cut, want, rtol=0, atol=1e-6)  # the same fp32 forward pass, then cut
    if cosine:
        np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)
        assert not np.allclose(cut, full[:, :16], atol=1e-3)  # the prefix alone is not unit length
    else:
        np.testing.assert_array_equal(cut, full[:, :16])
    manifest = list_shards(out)[0].manifest
    assert (manifest["dim"], manifest["truncate_dim"], manifest["model_dim"]) == (16, 16, 32)
    assert "truncate_dim" not in list_shards(tmp_path / "full")[0].manifest  # full-size manifests as before
    # float16 storage: the cut vectors rounded once (|Δ| <= 1e-3 for these unit-scale values)
    ids16h, half = read_embeddings(encode_corpus(model, passages, tmp_path / "h16", dim=16,
                                                 **{**FP32, "dtype": "float16"}))
    np.testing.assert_allclose(half, want, rtol=0, atol=2e-3)


def test_encode_dim_resumes_and_refuses_another_dim(cosine_run, tiny_data_dir, tmp_path, caplog):
    passages, out = _passages(tiny_data_dir), tmp_path / "emb"
    encode_corpus(cosine_run, passages, out, num_shards=2, dim=16, **FP32)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    caplog.set_level("INFO")
    encode_corpus(cosine_run, passages, out, num_shards=2, dim=16, **FP32)  # same dim: every shard skipped
    assert "already encoded" in caplog.text
    for other, shown in ((8, "dim=8"), (None, "dim=null")):
        with pytest.raises(DataError) as err:
            encode_corpus(cosine_run, passages, out, num_shards=2, dim=other, **FP32)
        msg = str(err.value)
        assert "dim=16" in msg and shown in msg and "\n" not in msg
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing on disk changed
    # full-size shards, then dim=16: refused too
    full = tmp_path / "full"
    encode_corpus(cosine_run, passages, full, **FP32)
    with pytest.raises(DataError, match="dim=null.*dim=16"):
        encode_corpus(cosine_run, passages, full, dim=16, **FP32)


def test_encode_dim_too_large_is_one_line_before_any_work(cosine_run, tiny_data_dir, tmp_path):
    out = tmp_path / "emb"
    with pytest.raises(ValueError, match="dim=64 is larger than the 32 dimensions"):
        encode_corpus(cosine_run, _passages(tiny_data_dir), out, dim=64, **FP32)
    assert not out.exists()
    proc = run_as_subprocess([str(BIN / "dpr-encode"), f"model={cosine_run}", f"passages={_passages(tiny_data_dir)}",
                              f"output_dir={out}", "dim=64"], capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "dim=64" in lines[0] and "32" in lines[0], proc.stderr
    assert not out.exists()
    proc = run_as_subprocess([str(BIN / "dpr-encode"), f"model={cosine_run}", f"passages={_passages(tiny_data_dir)}",
                              f"output_dir={out}", "dim=0"], capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "dim" in lines[0], proc.stderr


def test_saved_training_vectors_are_truncated_as_the_encoder_would(cosine_run, tiny_data_dir, tmp_path, caplog):
    """The pipeline's dense.dim: the trainer's vectors of the saved weights stored at that size, so the encode
    stage with dim then skips."""
    passages = _passages(tiny_data_dir)
    ids, full = read_embeddings(encode_corpus(cosine_run, passages, tmp_path / "full", **FP32))
    with_ = {"device": "cpu", "autocast": "off", "max_length": 256}
    from dpr.models import read_biencoder_config

    with_["max_length"] = read_biencoder_config(cosine_run).passage_max_length
    assert save_encoded(cosine_run, passages, tmp_path / "saved", ids, full, computed_with=with_, dim=16, **{
        k: v for k, v in FP32.items() if k not in ("batch_size", "progress")})
    _, saved = read_embeddings(tmp_path / "saved")
    np.testing.assert_allclose(saved, truncate(torch.from_numpy(full), 16, True).numpy(), atol=1e-6)
    caplog.set_level("INFO")
    encode_corpus(cosine_run, passages, tmp_path / "saved", dim=16, **FP32)
    assert "already encoded" in caplog.text


def test_retrieval_over_truncated_index_is_exact_search_over_truncated_vectors(cosine_run, tiny_data_dir, tmp_path):
    from dpr import Retriever
    from dpr.models import encode_texts, load_biencoder

    passages = _passages(tiny_data_dir)
    encode_corpus(cosine_run, passages, tmp_path / "emb", dim=16, **FP32)
    build_and_save(tmp_path / "emb", tmp_path / "i.faiss", factory="Flat")
    questions = [q for q, _, _ in TINY_QA]
    dense = Retriever.dense(cosine_run, tmp_path / "i.faiss", passages, autocast="off", device="cpu")
    got = dense.search_ids(questions, k=8)
    # by hand: full question vectors, cut by the same rule, against the truncated passages
    model, tok = load_biencoder(str(cosine_run))
    q = truncate(encode_texts(model, tok, questions, "question", autocast="off"), 16, True).numpy()
    ids, p = read_embeddings(tmp_path / "emb")
    scores = q @ p.T
    for row, s in zip(got, scores):
        order = np.argsort(-s, kind="stable")
        assert [pid for pid, _ in row] == [ids[i] for i in order]
        np.testing.assert_allclose([sc for _, sc in row], s[order], atol=1e-5)


def test_index_of_impossible_dimension_is_one_line_naming_it(cosine_run, tiny_data_dir, tmp_path):
    from dpr import Retriever

    x = np.random.default_rng(0).standard_normal((8, 48)).astype(np.float32)
    ids = [f"p{i}" for i in range(1, 9)]
    write_shard(tmp_path / "big", 0, 1, x, ids)  # larger than the model's 32
    build_and_save(tmp_path / "big", tmp_path / "big.faiss", factory="Flat")
    write_shard(tmp_path / "small", 0, 1, x[:, :16], ids)  # smaller, not recorded as a truncation
    build_and_save(tmp_path / "small", tmp_path / "small.faiss", factory="Flat")
    for name, words in (("big", ["48-dim", "32-dim", "another model"]), ("small", ["16-dim", "32-dim", "truncation"])):
        with pytest.raises(DataError) as err:
            Retriever.dense(cosine_run, tmp_path / f"{name}.faiss", autocast="off", device="cpu")
        msg = str(err.value)
        assert f"{name}.faiss" in msg and all(w in msg for w in words) and "\n" not in msg, msg
    # truncated shards recorded as such, but of another model size: refused as well
    write_shard(tmp_path / "other", 0, 1, x[:, :16], ids, truncate_dim=16, model_dim=48)
    build_and_save(tmp_path / "other", tmp_path / "other.faiss", factory="Flat")
    with pytest.raises(DataError, match="a truncation of other vectors"):
        Retriever.dense(cosine_run, tmp_path / "other.faiss", autocast="off", device="cpu")
    # an index without metadata (built elsewhere): taken as truncated, with a warning
    (tmp_path / "small.faiss.json").unlink()
    dense = Retriever.dense(cosine_run, tmp_path / "small.faiss", autocast="off", device="cpu")
    assert dense.truncate_dim == 16 and dense.encode(["a question"]).shape == (1, 16)
    assert json.loads((tmp_path / "big.faiss.json").read_text())["dim"] == 48
