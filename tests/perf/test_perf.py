"""dpr.perf (FLOPs, measured peak, CPU flags, the bench JSON interface) and the encoding levers' tolerances."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from dpr.perf import cpu_flags, cpu_supports_bf16, encoder_forward_flops, matmul_peak_gflops, mfu, total_flops
from dpr.perf.cpu import cpu_has_native_bf16
from dpr.perf.report import bench_report, format_table, row
from dpr.trainkit.precision import autocast_context, precision_context, resolve_precision


def test_forward_flops_equal_a_hand_count():
    cfg = SimpleNamespace(hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    b, s, h, i = 3, 5, 32, 64
    per_layer = (
        2 * b * s * h * h * 3  # Q, K, V
        + 2 * b * s * h * h  # attention output
        + 2 * b * s * h * i * 2  # feed-forward in and out
        + 2 * b * s * s * h * 2  # Q·Kᵀ and softmax·V
    )
    assert encoder_forward_flops(cfg, b, s) == 2 * per_layer == 510_720
    assert total_flops(cfg, [(b, s), (1, 7)], training=True) == 3 * (
        encoder_forward_flops(cfg, b, s) + encoder_forward_flops(cfg, 1, 7))


def test_mfu():
    assert mfu(2e9, 1.0, 4.0) == pytest.approx(0.5)
    assert mfu(2e9, 1.0, None) is None


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_peak_is_positive_and_finite(precision):
    g = matmul_peak_gflops(precision, n=64, repeat=2)
    assert g > 0 and math.isfinite(g)


def test_peak_refuses_unknown_precision():
    with pytest.raises(ValueError, match="precision"):
        matmul_peak_gflops("fp8", n=8)


def test_no_bf16_override(monkeypatch):
    monkeypatch.delenv("DPR_FORCE_BF16", raising=False)
    monkeypatch.setenv("DPR_NO_BF16", "1")
    assert cpu_supports_bf16() is False
    assert isinstance(cpu_flags(), tuple)


def test_force_bf16_override_makes_auto_take_the_bf16_path(monkeypatch):
    """``DPR_FORCE_BF16=1`` is the other direction: ``auto`` means bf16 on any CPU (emulated where the CPU
    has no native bf16), in the one rule every place resolves ``auto`` with (training, inference, the reader:
    `dpr.trainkit.precision`)."""
    monkeypatch.delenv("DPR_NO_BF16", raising=False)
    monkeypatch.setenv("DPR_FORCE_BF16", "1")
    assert cpu_supports_bf16() is True
    assert resolve_precision("auto", torch.device("cpu"), training=True) == "bf16"
    assert precision_context("auto", "cpu", training=True)[1] == "bf16"
    with autocast_context(torch.device("cpu"), "auto"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    monkeypatch.setenv("DPR_FORCE_BF16", "0")  # "0" and "" mean unset, as for DPR_NO_BF16
    assert cpu_supports_bf16() is cpu_has_native_bf16()


def test_both_precision_switches_are_refused(monkeypatch):
    monkeypatch.setenv("DPR_NO_BF16", "1")
    monkeypatch.setenv("DPR_FORCE_BF16", "1")
    with pytest.raises(ValueError, match="DPR_NO_BF16 and DPR_FORCE_BF16 are both set"):
        cpu_supports_bf16()


def test_report_interface():
    rows = [row("ours", "fp32", 20.0, 0.1), row("peer", "fp32", 10.0), row("ours", "int8", 30.0)]
    rep = bench_report(rows, "peer", "fp32", {"fp32": 100.0, "bf16": None})
    assert set(rep) >= {"rows", "ratio", "peak_gflops", "cpu_flags"}
    assert rep["ratio"] == {"fp32": 2.0, "bf16": None, "best": 2.0}
    assert [r["precision"] for r in rep["rows"]] == ["fp32", "fp32", "int8"]
    assert "ratio_levers" not in rep
    with pytest.raises(ValueError):
        row("ours", "fp16", 1.0)
    # a lever that is no default (runtime=onnx) is its own system: ratio.fp32/best stay ours over peer
    levers = rows + [row("ours-onnx", "fp32", 40.0), row("peer-onnx", "fp32", 25.0)]
    rep = bench_report(levers, "peer", "fp32", {"fp32": 100.0, "bf16": None})
    assert rep["ratio"] == {"fp32": 2.0, "bf16": None, "best": 2.0}
    assert rep["ratio_levers"] == {"onnx": {"precision": "fp32", "vs_peer_default": 4.0, "vs_peer_same_lever": 1.6}}
    assert rep["rows"][0]["system"] == "ours"


def _cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=1)


TEXTS = ["Honolulu is the capital of Hawaii.", "Paris is the capital and most populous city of France.",
         "The mitochondria is the powerhouse of the cell, producing ATP for the cell's processes.", "Berlin."]


def test_format_table_shows_each_row_mfu_as_percent_and_missing_as_dash():
    report = bench_report([row("ours", "fp32", 10.0, 0.5, top20=0.9), row("st", "fp32", 8.0)], "st", "fp32",
                          {"fp32": 100.0})
    lines = format_table(report, [("psg/s", "per_s", ".1f"), ("MFU", "mfu", ""), ("top-20", "top20", "")]).splitlines()
    assert lines[0].split() == ["system", "precision", "psg/s", "MFU", "top-20"]
    assert lines[1].split() == ["ours", "fp32", "10.0", "50.0%", "0.9"]
    assert lines[2].split() == ["st", "fp32", "8.0", "-", "-"]
    assert lines[3].startswith("ratios (ours / peer): {'fp32': 1.25")


def test_int8_lever_within_its_tolerance(tiny_model_dir):
    from dpr.models import encode_texts, load_biencoder
    from dpr.models.quantize import quantize_for_inference, resolve_quantize

    model, tok = load_biencoder(str(tiny_model_dir), pooling="mean")
    ref = encode_texts(model, tok, TEXTS, "passage", autocast="off")
    q = quantize_for_inference(model, "int8")
    assert q is not model and isinstance(model.question_encoder.encoder.layer[0].intermediate.dense, torch.nn.Linear)
    out = encode_texts(q, tok, TEXTS, "passage", autocast="off")
    # int8's stated tolerance (dpr/models/quantize.py: ≈0.96 min on MiniLM), not the 0.99 quality bar
    assert _cosines(out, ref).min() >= 0.95
    assert quantize_for_inference(model, "none") is model
    assert resolve_quantize("auto") == "none"
    with pytest.raises(ValueError, match="quantize"):
        resolve_quantize("int4")
    with pytest.raises(ValueError, match="CPU"):
        resolve_quantize("int8", "cuda")


def test_bf16_lever_within_its_tolerance(tiny_model_dir):
    from dpr.models import encode_texts, load_biencoder

    model, tok = load_biencoder(str(tiny_model_dir), pooling="mean")
    ref = encode_texts(model, tok, TEXTS, "passage", autocast="off")
    out = encode_texts(model, tok, TEXTS, "passage", autocast="bf16")
    assert _cosines(out, ref).min() >= 0.99
