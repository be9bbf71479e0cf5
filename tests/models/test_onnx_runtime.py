"""The ONNX Runtime encoding lever (``encode.runtime=onnx``, `dpr.models.onnx_runtime`) on the tiny model:
its vectors against torch's, the export cache, resume across runtimes, and the errors."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.encode_kw import encode_corpus  # the keyword form: settings split into EncodeConfig
from dpr.index.shards import ShardFiles, list_shards
from dpr.models import BiEncoderConfig, build_biencoder, encode_texts
from dpr.models.onnx_runtime import min_cosine, onnx_tower, require_onnxruntime, resolve_runtime
from tests.run_command import run_as_subprocess

# Stated tolerance of the lever: every vector within cosine 0.999 of torch fp32 (measured on MiniLM: 1.0000,
# max abs difference 2e-7), here also a small absolute difference.
MIN_COSINE, MAX_ABS = 0.999, 1e-4

# Batches of 3 over these (length-sorted): padded batches of other shapes than the traced one, and a batch of 1.
TEXTS = ["oahu", "the sun",
         "a much longer passage about the capital of hawaii, honolulu, on the island of oahu, with more words",
         "paris is the capital of france", "berlin is the capital of germany", "tokyo is the capital of japan",
         "water boils at 100 degrees", "x", "mount everest", "a medium length passage about the pacific ocean"]
TITLES = ["Oahu", "Sun", "Honolulu", "Paris", "Berlin", "Tokyo", "", "X", "Everest", "Pacific Ocean"]


def _kw(tmp_path: Path, **extra) -> dict:
    return dict(num_shards=2, batch_size=3, dtype="float32", autocast="off", cache_dir=tmp_path / "cache",
                progress=False, **extra)


@pytest.mark.parametrize("config", [
    {"pooling": "mean"},
    {"pooling": "cls", "projection_dim": 16, "similarity": "cosine"},  # projection and normalisation in the graph
])
def test_onnx_vectors_equal_torch(tiny_model_dir, tmp_path, monkeypatch, config):
    pytest.importorskip("onnxruntime")
    model, tok = build_biencoder(BiEncoderConfig(name=str(tiny_model_dir), **config))
    paths = {}
    for tower in ("passage", "question"):
        titles = TITLES if tower == "passage" else None
        ref = encode_texts(model, tok, TEXTS, tower, batch_size=3, autocast="off", titles=titles)
        runner = onnx_tower(model, tok, tower, "test-model", cache_dir=tmp_path)
        paths[tower] = runner.path
        out = encode_texts(model, tok, TEXTS, tower, batch_size=3, autocast="off", titles=titles, runner=runner)
        assert out.shape == ref.shape == (len(TEXTS), model.dim) and out.dtype == torch.float32
        assert min_cosine(out, ref) >= MIN_COSINE and float((out - ref).abs().max()) <= MAX_ABS
        # the torch model is untouched by the export (which traces a copy)
        again = encode_texts(model, tok, TEXTS, tower, batch_size=3, autocast="off", titles=titles)
        np.testing.assert_array_equal(again.numpy(), ref.numpy())

    # the second call loads the cached graph: no export
    import dpr.models.onnx_runtime as ort_mod

    monkeypatch.setattr(ort_mod, "export_tower", lambda *a, **k: pytest.fail("exported twice"))
    assert onnx_tower(model, tok, "passage", "test-model", cache_dir=tmp_path).path == paths["passage"]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["passage.onnx", "question.onnx"]


def test_resumed_encode_redoes_shards_of_the_other_runtime(tiny_model_dir, tiny_data_dir, tmp_path, caplog):
    pytest.importorskip("onnxruntime")
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    out = tmp_path / "emb"
    torch_vecs = np.concatenate([np.asarray(s.vectors()) for s in list_shards(encode_corpus(
        tiny_model_dir, passages, out, runtime="torch", **_kw(tmp_path)))])
    assert {s.manifest["runtime"] for s in list_shards(out)} == {"torch"}

    with caplog.at_level(logging.INFO, logger="dpr.encode"):
        encode_corpus(tiny_model_dir, passages, out, runtime="onnx", **_kw(tmp_path))
    assert "already encoded" not in caplog.text  # both torch shards redone, none reused
    shards = list_shards(out)
    assert {s.manifest["runtime"] for s in shards} == {"onnx"}
    onnx_vecs = np.concatenate([np.asarray(s.vectors()) for s in shards])
    assert min_cosine(torch.from_numpy(onnx_vecs), torch.from_numpy(torch_vecs)) >= MIN_COSINE

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dpr.encode"):
        encode_corpus(tiny_model_dir, passages, out, runtime="onnx", **_kw(tmp_path))
    assert "all 2 assigned shard(s) already encoded" in caplog.text

    # one shard resumed with torch: that shard is redone with torch, not kept from onnx
    encode_corpus(tiny_model_dir, passages, out, shard_id=1, runtime="torch", **_kw(tmp_path))
    assert [s.manifest["runtime"] for s in list_shards(out)] == ["onnx", "torch"]

    # a shard written before the runtime was recorded counts as torch
    manifest = ShardFiles.of(out, 1, 2).manifest
    old = json.loads(manifest.read_text())
    del old["runtime"]
    manifest.write_text(json.dumps(old))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dpr.encode"):
        encode_corpus(tiny_model_dir, passages, out, shard_id=1, runtime="torch", **_kw(tmp_path))
    assert "shard 1/2 already encoded" in caplog.text


def test_runtime_errors(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    passages = tiny_data_dir / "tiny" / "passages.tsv"
    assert resolve_runtime(None) == "torch" and resolve_runtime("ONNX") == "onnx"
    with pytest.raises(ValueError, match=r"runtime must be one of \('auto', 'torch', 'onnx'\), got 'tensorrt'"):
        encode_corpus(tiny_model_dir, passages, tmp_path / "a", runtime="tensorrt", **_kw(tmp_path))
    assert not (tmp_path / "a").exists()  # refused before any work
    if not torch.cuda.is_available():  # the device rule's check comes first: cuda is refused here as unusable
        with pytest.raises(ValueError, match="device=cuda: "):
            encode_corpus(tiny_model_dir, passages, tmp_path / "b", runtime="onnx", device="cuda", **_kw(tmp_path))
    # where cuda is a usable device (patched here, as on a GPU machine), runtime=onnx still refuses it
    monkeypatch.setattr("dpr.distributed.check_device", lambda name: name)
    with pytest.raises(ValueError, match="CPU only"):
        encode_corpus(tiny_model_dir, passages, tmp_path / "b", runtime="onnx", device="cuda", **_kw(tmp_path))
    monkeypatch.undo()
    assert not (tmp_path / "b").exists()
    if importlib.util.find_spec("onnxruntime") is not None:
        with pytest.raises(ValueError, match="separate levers"):
            encode_corpus(tiny_model_dir, passages, tmp_path / "c", runtime="onnx", quantize="int8", **_kw(tmp_path))
        with pytest.raises(ValueError, match="fp32"):
            encode_corpus(tiny_model_dir, passages, tmp_path / "d", runtime="onnx",
                          **{**_kw(tmp_path), "autocast": "bf16"})
    # onnxruntime missing: one line saying what to install, before any work
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ValueError, match=r"runtime=onnx needs onnxruntime and onnx.*pip install") as err:
        encode_corpus(tiny_model_dir, passages, tmp_path / "e", runtime="onnx", **_kw(tmp_path))
    assert "\n" not in str(err.value) and not (tmp_path / "e").exists()
    with pytest.raises(ValueError, match="onnxruntime"):
        require_onnxruntime()


def test_auto_runtime_is_onnx_exactly_where_the_encode_runs_in_fp32_on_an_avx512_cpu(monkeypatch):
    import dpr.perf.cpu as perf_cpu
    import dpr.trainkit.precision as precision

    have_ort = importlib.util.find_spec("onnxruntime") is not None
    for has_bf16, avx512 in [(True, True), (False, True), (False, False), (True, False)]:
        monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: has_bf16)  # where the one precision rule asks
        monkeypatch.setattr(perf_cpu, "cpu_has_avx512", lambda: avx512)
        onnx = "onnx" if have_ort and avx512 else "torch"  # with AVX2 only, ONNX Runtime is no faster than torch
        assert resolve_runtime("auto", "cpu", "auto") == (onnx if not has_bf16 else "torch")
        assert resolve_runtime("auto", "cpu", "off") == onnx  # fp32 asked for
        assert resolve_runtime("auto", "cpu", "bf16") == "torch"
        assert resolve_runtime("auto", "cpu", "off", quantize="int8") == "torch"
        assert resolve_runtime("auto", "cuda", "off") == "torch"
        assert resolve_runtime("onnx", "cpu", "off") == "onnx"  # asked for by name: on any CPU
    monkeypatch.setattr(perf_cpu, "cpu_has_avx512", lambda: True)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # not installed: torch, no error
    assert resolve_runtime("auto", "cpu", "off") == "torch"


def test_cpu_has_avx512_reads_torchs_capability(monkeypatch):
    import dpr.perf.cpu as perf_cpu

    for capability, expected in [("AVX512", True), ("AVX512_BF16", True), ("AVX2", False), ("DEFAULT", False)]:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert perf_cpu.cpu_has_avx512() is expected


def test_cli_bad_runtime_is_one_line(tiny_model_dir, tiny_data_dir, tmp_path):
    proc = run_as_subprocess([str(Path(sys.executable).parent / "dpr-encode"), f"model={tiny_model_dir}",
                              f"passages={tiny_data_dir / 'tiny' / 'passages.tsv'}", f"output_dir={tmp_path / 'emb'}",
                              "runtime=tensorrt"], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "WANDB_MODE": "disabled"})
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("dpr-")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "runtime must be one of ('auto', 'torch', 'onnx'), got 'tensorrt'" in lines[0]
