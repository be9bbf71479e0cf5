"""The torch.compile encoding lever (`dpr.models.compile`, ``encode.compile``): compiled vectors against eager on a
tiny model, and dpr-encode's bookkeeping (manifests record the setting; a resume that would mix compiled and eager
shards is refused, and so is an index of both; a platform where inductor cannot compile gets one clear line)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

import dpr.models.compile as compile_mod
from tests.encode_kw import encode_corpus, save_encoded  # the keyword form: settings split into EncodeConfig
from dpr.errors import DataError
from dpr.index.shards import ShardFiles, list_shards
from dpr.models import encode_texts, load_biencoder
from dpr.models.compile import compile_tower, compile_unavailable, resolve_compile

from tests.models.test_bf16_weights import random_texts

UNAVAILABLE = compile_unavailable("cpu")
needs_compile = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"torch.compile cannot compile here: {UNAVAILABLE}")


def _kw(tmp_path, **extra) -> dict:
    return dict(num_shards=2, batch_size=4, dtype="float32", runtime="torch", cache_dir=tmp_path / "arrow",
                progress=False, device="cpu", autocast="off", **extra)


def test_resolve_compile():
    assert resolve_compile(None) is False and resolve_compile(False) is False and resolve_compile(True) is True
    assert resolve_compile("true") is True and resolve_compile("False") is False  # an untyped +encode.compile=...
    with pytest.raises(ValueError, match="compile must be true or false"):
        resolve_compile("yes please")
    with pytest.raises(ValueError, match="compile must be true or false"):
        resolve_compile(1)
    with pytest.raises(ValueError, match="runtime=onnx are separate levers"):
        resolve_compile(True, runtime="onnx")
    with pytest.raises(ValueError, match="quantize=int8 are separate levers"):
        resolve_compile(True, quantize="int8")
    assert resolve_compile(False, runtime="onnx", quantize="int8") is False  # off: nothing to contradict


@needs_compile
@pytest.mark.parametrize("autocast", ["off", "bf16"])
def test_compiled_vectors_equal_eager_tiny_bert(tiny_model_dir, one_thread, autocast):
    """Every vector within 1e-4 of eager's and at cosine >= 0.9999, over batches of many lengths (dynamic=True:
    one graph for them all), in fp32 and under bf16 autocast (the default on bf16 CPUs)."""
    model, tok = load_biencoder(str(tiny_model_dir), pooling="mean")
    compiled = compile_tower(copy.deepcopy(model), "passage")
    assert compiled.passage_encoder._compiled_call_impl is not None  # compiled in place: same module and keys
    assert model.passage_encoder._compiled_call_impl is None  # the eager copy is untouched
    assert compiled.state_dict().keys() == model.state_dict().keys()
    passages = random_texts(40, seed=3, lo=2, hi=60)
    kw = dict(batch_size=16, device="cpu", autocast=autocast)
    ref = encode_texts(model, tok, passages, "passage", **kw)
    got = encode_texts(compiled, tok, passages, "passage", **kw)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    cos = torch.nn.functional.cosine_similarity(ref, got, dim=1)
    assert cos.min().item() >= 0.9999, cos.min().item()
    if autocast == "off":
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-4)


def test_encode_refuses_to_mix_compiled_and_eager_shards(tiny_model_dir, tiny_data_dir, tmp_path, one_thread):
    """Eager shards, then a resume with compile=true: refused before any model is loaded (one line naming the
    manifest and the field); shards from before the setting was recorded count as eager."""
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    out = tmp_path / "emb"
    encode_corpus(tiny_model_dir, passages, out, **_kw(tmp_path))
    assert [s.manifest["compile"] for s in list_shards(out)] == [False, False]
    with pytest.raises(DataError, match="compile=false, this run encodes with compile=true") as err:
        encode_corpus(tiny_model_dir, passages, out, **_kw(tmp_path, compile=True))
    assert "\n" not in str(err.value) and "shard_000_of_002.json" in str(err.value) and "field 'compile'" in str(err.value)
    files = ShardFiles.of(out, 0, 2)
    manifest = json.loads(files.manifest.read_text())
    del manifest["compile"]  # written before the key existed: eager
    files.manifest.write_text(json.dumps(manifest))
    mtime = files.vectors.stat().st_mtime_ns
    encode_corpus(tiny_model_dir, passages, out, **_kw(tmp_path))  # an eager resume reuses it
    assert files.vectors.stat().st_mtime_ns == mtime
    assert [s.manifest.get("compile") for s in list_shards(out)] == [None, False]  # the index: both eager
    with pytest.raises(DataError, match="compile=false, this run encodes with compile=true"):
        encode_corpus(tiny_model_dir, passages, out, **_kw(tmp_path, compile=True, shard_id=1))


@needs_compile
def test_compiled_shards_record_it_and_refuse_an_eager_resume(tiny_model_dir, tiny_data_dir, tmp_path, one_thread):
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    out, ref = tmp_path / "emb", tmp_path / "ref"
    encode_corpus(tiny_model_dir, passages, out, **_kw(tmp_path, compile=True))
    encode_corpus(tiny_model_dir, passages, ref, **_kw(tmp_path))
    shards = list_shards(out)
    assert [s.manifest["compile"] for s in shards] == [True, True]
    got = np.concatenate([np.asarray(s.vectors()) for s in shards])
    want = np.concatenate([np.asarray(s.vectors()) for s in list_shards(ref)])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)  # what the manifest says: compiled = eager's vectors
    mtime = shards[0].files.vectors.stat().st_mtime_ns
    encode_corpus(tiny_model_dir, passages, out, **_kw(tmp_path, compile=True))  # same setting: skipped
    assert shards[0].files.vectors.stat().st_mtime_ns == mtime
    with pytest.raises(DataError, match="compile=true, this run encodes with compile=false"):
        encode_corpus(tiny_model_dir, passages, out, **_kw(tmp_path))


def test_index_refuses_compiled_and_eager_shards(tiny_model_dir, tiny_data_dir, tmp_path, one_thread):
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    out = tmp_path / "emb"
    encode_corpus(tiny_model_dir, passages, out, **_kw(tmp_path))
    files = ShardFiles.of(out, 1, 2)
    manifest = json.loads(files.manifest.read_text())
    files.manifest.write_text(json.dumps({**manifest, "compile": True}))  # as if written by another run
    with pytest.raises(DataError, match="field 'compile'"):
        list_shards(out)


def test_compile_where_inductor_cannot_compile_is_one_clear_error(tiny_model_dir, tiny_data_dir, tmp_path,
                                                                   monkeypatch):
    """A platform without a working C++ compiler (simulated): compile=true stops with one line saying so, before
    the model is loaded and before anything is written."""
    import dpr.models

    monkeypatch.setattr(compile_mod, "compile_unavailable", lambda device_type="cpu": "CalledProcessError: no g++")

    def no_model(*a, **k):
        raise AssertionError("the model must not be loaded")

    monkeypatch.setattr(dpr.models, "load_biencoder", no_model)
    out = tmp_path / "emb"
    with pytest.raises(ValueError, match=r"torch.compile cannot compile on this platform \(CalledProcessError: no g\+\+\)"
                                         r".*compile=false") as err:
        encode_corpus(tiny_model_dir, tiny_data_dir / "tiny" / "passages.tsv", out, **_kw(tmp_path, compile=True))
    assert "\n" not in str(err.value)
    assert not list(out.glob("shard_*"))


def test_save_encoded_never_stores_vectors_as_compiled(tiny_model_dir, tiny_data_dir, tmp_path):
    """Training's vectors are eager: stored as a compiled run's shard they would not be what the manifest says."""
    from dpr.models import save_biencoder

    run = tmp_path / "run"
    save_biencoder(*load_biencoder(str(tiny_model_dir)), run)
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    ids = [line.split("\t")[0] for line in passages.read_text().splitlines()[1:]]
    vectors = np.ones((len(ids), 32), dtype=np.float32)
    kw = dict(computed_with={"device": "cpu", "autocast": "off", "max_length": 256}, dtype="float32",
              autocast="off", runtime="torch", device="cpu", cache_dir=tmp_path / "arrow")
    assert not save_encoded(run, passages, tmp_path / "c", ids, vectors, compile=True, **kw)
    assert save_encoded(run, passages, tmp_path / "e", ids, vectors, **kw)
    assert list_shards(tmp_path / "e")[0].manifest["compile"] is False
