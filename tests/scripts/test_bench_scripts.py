"""scripts/bench_encode.py, scripts/bench_train.py and scripts/profile_step.py end to end on the tiny model: the
--json interface."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.scripts import script

KEYS = {"rows", "ratio", "peak_gflops", "cpu_flags"}


def _check(rep: dict, precisions: set[str]) -> None:
    assert set(rep) >= KEYS and set(rep["ratio"]) == {"fp32", "bf16", "best"}
    assert {r["precision"] for r in rep["rows"]} == precisions
    for r in rep["rows"]:
        assert set(r) >= {"system", "precision", "per_s", "mfu"} and r["per_s"] > 0
        assert (r["mfu"] is not None) == (r["system"].startswith("ours") and r["precision"] != "int8")
    assert rep["ratio"]["fp32"] > 0 and rep["ratio"]["best"] > 0


@pytest.mark.parametrize("avx512", [True, False])
def test_bench_encode_json(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch, avx512):
    import dpr.perf.cpu as perf_cpu

    monkeypatch.delenv("DPR_FORCE_BF16", raising=False)
    monkeypatch.setenv("DPR_NO_BF16", "1")  # the "CPU without bf16" path: fp32 and int8 rows
    monkeypatch.setattr(perf_cpu, "cpu_has_avx512", lambda: avx512)  # auto's runtime follows it
    out = tmp_path / "encode.json"
    script("bench_encode").main(["--model", str(tiny_model_dir), "--data-dir", str(tiny_data_dir),
                                 "--dataset", "tiny", "--n", "8", "--qa", "4", "--repeat", "1",
                                 "--peak-n", "64", "--no-corpus", "--no-bf16", "--onnx-cache", str(tmp_path / "onnx"),
                                 "--no-compile", "--json", str(out)])
    rep = json.loads(out.read_text())
    _check(rep, {"fp32", "int8"})
    onnx_row = [r for r in rep["rows"] if r["system"] == "ours-onnx"]  # the runtime=onnx lever, fp32
    if importlib.util.find_spec("onnxruntime") is None:  # a GPU install (extra gpu) has no onnxruntime
        assert not onnx_row and "runtime=onnx needs onnxruntime" in rep["skipped"]["ours-onnx"]
        assert rep["ratio"]["best"] == rep["ratio"]["fp32"]  # the default is then torch fp32
        return
    # without bf16 the default runtime (auto) is ONNX Runtime where the CPU has AVX-512, torch otherwise:
    # ratio.best is that row over the peer's fp32
    if avx512:
        assert rep["ours_default"] == "ours-onnx fp32"
        assert rep["ratio"]["best"] == rep["ratio_levers"]["onnx"]["vs_peer_default"]
    else:
        assert rep["ours_default"] == "fp32" and rep["ratio"]["best"] == rep["ratio"]["fp32"]  # torch fp32
    assert [r["precision"] for r in onnx_row] == ["fp32"] and onnx_row[0]["cosine_min_vs_ours_fp32"] >= 0.999
    assert onnx_row[0]["top20_equal_ours_fp32"] is True and rep["ratio_levers"]["onnx"]["vs_peer_default"] > 0
    assert rep["ratio"]["bf16"] is None and rep["peak_gflops"]["bf16"] is None
    assert all(r["top20_equal_ours_fp32"] is not None for r in rep["rows"])
    assert "bf16-weights" not in rep["ratio_levers"]  # no bf16 rows on a CPU without bf16
    assert {r["system"]: r["levers"] for r in rep["rows"] if r["system"].startswith("ours")}["ours-onnx"] == [
        "encode.runtime=onnx"]
    # the batching before token sorting: its own row, the same vectors, never fewer padded tokens
    char = next(r for r in rep["rows"] if r["system"] == "ours-char-sort")
    assert char["precision"] == "fp32" and char["levers"] == ["encode.autocast=off", "encode.length_sort=chars"]
    assert char["cosine_min_vs_ours_fp32"] >= 0.9999 and char["top20_equal_ours_fp32"] is True
    assert rep["tokens"] <= rep["padded_tokens"] <= rep["padded_tokens_char_sort"]
    assert rep["ratio_levers"]["char-sort"]["vs_peer_default"] > 0


def test_bench_encode_bf16_weights_row(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """Where the bf16 rows run (DPR_FORCE_BF16: emulated bf16 on any CPU), the bf16-weights lever is a row of its
    own, compared with our bf16 autocast vectors."""
    monkeypatch.delenv("DPR_NO_BF16", raising=False)
    monkeypatch.setenv("DPR_FORCE_BF16", "1")
    out = tmp_path / "encode.json"
    script("bench_encode").main(["--model", str(tiny_model_dir), "--data-dir", str(tiny_data_dir),
                                 "--dataset", "tiny", "--n", "8", "--qa", "4", "--repeat", "1", "--peak-n", "64",
                                 "--no-corpus", "--no-int8", "--no-onnx", "--no-compile", "--json", str(out)])
    rep = json.loads(out.read_text())
    _check(rep, {"fp32", "bf16"})
    (lever,) = [r for r in rep["rows"] if r["system"] == "ours-bf16-weights"]
    assert lever["precision"] == "bf16" and lever["levers"] == ["encode.weights=bf16"]
    assert lever["cosine_min_vs_ours_bf16"] >= 0.99 and lever["top20"] is not None
    assert rep["ratio_levers"]["bf16-weights"]["vs_peer_default"] > 0
    assert rep["ratio_levers"]["bf16-weights"]["vs_peer_same_lever"] is None  # the peer has no such lever
    assert rep["ratio"]["bf16"] > 0 and rep["ours_default"] == "bf16"  # the default stays autocast


def test_bench_encode_compiled_row(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """The encode.compile lever: a row of its own in our default torch precision, its compile timed apart, its
    vectors at cosine >= 0.9999 against ours eager; end to end through encode_corpus too."""
    from dpr.models.compile import compile_unavailable

    if (why := compile_unavailable("cpu")) is not None:
        pytest.skip(f"torch.compile cannot compile here: {why}")
    monkeypatch.delenv("DPR_FORCE_BF16", raising=False)
    monkeypatch.setenv("DPR_NO_BF16", "1")
    out = tmp_path / "encode.json"
    script("bench_encode").main(["--model", str(tiny_model_dir), "--data-dir", str(tiny_data_dir),
                                 "--dataset", "tiny", "--n", "8", "--repeat", "1", "--peak-n", "64", "--no-bf16",
                                 "--no-int8", "--no-onnx", "--json", str(out)])
    rep = json.loads(out.read_text())
    _check(rep, {"fp32"})
    (lever,) = [r for r in rep["rows"] if r["system"] == "ours-compiled"]
    assert lever["precision"] == "fp32" and lever["levers"] == ["encode.autocast=off", "encode.compile=true"]
    assert lever["cosine_min_vs_eager"] >= 0.9999 and lever["first_pass_s"] > 0 and lever["compile_s"] >= 0
    assert rep["ratio_levers"]["compiled"]["vs_peer_default"] > 0
    assert rep["encode_corpus_compiled_per_s_incl_load_and_compile"] > 0


def test_bench_train_json(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """The ours row is dpr-train's default step (TrainConfig's bucket size and AdamW kernels, malloc tuned as
    dpr-train tunes it); the padded step, fused AdamW and no attention dropout are lever rows; the peer runs
    untuned, padded."""
    from dpr.perf.malloc import keep_freed_memory
    from dpr.training.config import TrainConfig

    monkeypatch.delenv("DPR_FORCE_BF16", raising=False)
    monkeypatch.setenv("DPR_NO_BF16", "1")
    out = tmp_path / "train.json"
    # 4 questions x (1 + 2) passages: 12 passage rows, more than a bucket of 8, so the buckets split
    script("bench_train").main(["--model", str(tiny_model_dir), "--data-dir", str(tiny_data_dir),
                                "--data", "tiny", "--steps", "2", "--batch-size", "4", "--hard-negatives", "2",
                                "--peak-n", "64", "--no-bf16", "--json", str(out)])
    rep = json.loads(out.read_text())
    _check(rep, {"fp32"})
    rows = {r["system"]: r for r in rep["rows"]}
    assert set(rows) == {"ours", "ours-padded", "ours-fused-adamw", "ours-no-attn-dropout", "sentence-transformers"}
    assert rows["ours-no-attn-dropout"]["levers"] == ["train.precision=fp32", "train.attention_dropout=0"]
    assert rows["ours-no-attn-dropout"]["settings"] == {**rows["ours"]["settings"], "attention_dropout": 0.0}
    assert rows["ours-fused-adamw"]["levers"] == ["train.precision=fp32", "train.optimizer_impl=fused"]
    assert rows["ours-padded"]["levers"] == ["train.precision=fp32", "train.length_bucket_size=0"]
    assert rows["ours"]["levers"] == ["train.precision=fp32"] and rows["sentence-transformers"]["levers"] == []
    tuned = keep_freed_memory()  # True on glibc: what dpr-train does
    assert rows["ours"]["settings"] == {"length_bucket_size": TrainConfig().bucket_size_for("cpu"),
                                        "optimizer_impl": "foreach", "malloc_tuned": tuned, "towers": "shared",
                                        "mask_answers": False}
    assert rows["ours-padded"]["settings"]["length_bucket_size"] == 0
    assert rows["ours-fused-adamw"]["settings"]["optimizer_impl"] == "fused"
    assert rows["sentence-transformers"]["settings"]["malloc_tuned"] is False
    assert rep["malloc_tuning"] == {"ours": tuned, "sentence-transformers": False}
    assert rows["ours"]["tokens_per_step"] <= rows["ours-padded"]["tokens_per_step"]  # buckets trim padding
    assert rep["ratio"]["fp32"] == round(rows["ours"]["per_s"] / rows["sentence-transformers"]["per_s"], 3)
    assert rep["ratio_levers"]["fused-adamw"]["vs_peer_default"] > 0 and rep["ratio_levers"]["padded"]["vs_peer_default"] > 0
    assert rep["ratio_levers"]["no-attn-dropout"]["vs_peer_default"] > 0
    # (no loss comparison here: the rows step in turn in train mode, so each one's dropout draws differ;
    # fused = plain step for step is tests/training/test_optim_impl.py's)


def _train_bench(name: str, tiny_model_dir, tiny_data_dir, out) -> dict:
    """A bench of dpr-train processes on the tiny model and data, one round of 2 steps; its JSON must be its return."""
    rep = script(name).main([
        "--data-dir", str(tiny_data_dir), "--steps", "2", "--batch-size", "4", "--rounds", "1", "--json", str(out),
        "--extra", "data.name=tiny", "data.kind=qa", f"model.name={tiny_model_dir}", "model.pooling=mean",
        "model.passage_max_length=64", "train.lr=1e-3"])
    assert json.loads(out.read_text()) == rep
    assert rep["ratio"]["best"] > 0 and all(r["maxrss_gb"] > 0 and r["per_s"] > 0 for r in rep["rows"])
    return rep


def test_bench_malloc_json(tiny_model_dir, tiny_data_dir, tmp_path):
    rep = _train_bench("bench_malloc", tiny_model_dir, tiny_data_dir, tmp_path / "malloc.json")
    assert {r["system"] for r in rep["rows"]} == {"ours", "glibc-default"}
    assert rep["same_loss"]  # the tuning changes no number


def test_bench_length_buckets_json(tiny_model_dir, tiny_data_dir, tmp_path):
    rep = _train_bench("bench_length_buckets", tiny_model_dir, tiny_data_dir, tmp_path / "buckets.json")
    assert {r["system"]: r["bucket_size"] for r in rep["rows"]} == {"ours": 8, "ours-buckets16": 16,
                                                                   "one-padded-forward": 0}
    assert "buckets16" in rep["ratio_levers"]


@pytest.mark.parametrize("precision", ["auto", "both"])
def test_profile_step_json(tmp_path, monkeypatch, capsys, precision):
    """scripts/profile_step.py --tiny: one profile per (train | encode, precision), top operators by self CPU
    time whose shares sum to at most 100, the CPU flags and the settings; the markdown tables printed and written."""
    monkeypatch.delenv("DPR_FORCE_BF16", raising=False)
    monkeypatch.setenv("DPR_NO_BF16", "1")  # auto: fp32 only; both: bf16 forced as well
    out, md = tmp_path / "profile.json", tmp_path / "profile.md"
    attn = ["--attention-dropout", "0"] if precision == "both" else []  # train.attention_dropout=0's step
    rep = script("profile_step").main(["--tiny", "--precision", precision, "--passages", "8", "--top", "10",
                                       "--json", str(out), "--md", str(md), *attn])
    assert json.loads(out.read_text()) == rep
    assert set(rep) >= {"cpu_flags", "cpu", "settings", "profiles"} and isinstance(rep["cpu_flags"], list)
    want = ["fp32"] if precision == "auto" else ["fp32", "bf16"]
    assert rep["settings"]["precisions"] == want and rep["settings"]["length_bucket_size"] > 0
    assert rep["settings"]["attention_dropout"] == (0.0 if attn else None)
    assert [(p["what"], p["precision"]) for p in rep["profiles"]] == [(w, q) for q in want for w in ("train", "encode")]
    for p in rep["profiles"]:
        assert 0 < len(p["ops"]) <= 10 and p["wall_ms"] > 0 and p["ops_self_ms"] > 0
        for op in p["ops"]:
            assert set(op) == {"name", "self_ms", "share", "calls"} and op["self_ms"] >= 0 and op["calls"] >= 1
        shares = [op["share"] for op in p["ops"]]
        assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 100
    assert all(any(op["name"].startswith("aten::") for op in p["ops"]) for p in rep["profiles"])
    printed = capsys.readouterr().out
    assert "| operator | self ms | share | calls |" in printed and md.read_text().strip() in printed


def test_bench_overhead_json(tiny_data_dir, tmp_path):
    """The CPU proxy: ours (the real trainer) and the peer, train and encode rows with examples/s and host ms."""
    out = tmp_path / "overhead.json"
    script("bench_overhead").main(["--data-dir", str(tiny_data_dir), "--data", "tiny", "--batch-size", "2",
                                   "--steps", "3", "--skip", "1", "--repeat", "1", "--passages", "16",
                                   "--encode-batch-size", "8", "--json", str(out)])
    rep = json.loads(out.read_text())
    assert set(rep) >= {"rows", "ratio"} and set(rep["ratio"]) == {"train", "encode"}
    assert {(r["system"], r["stage"]) for r in rep["rows"]} == {
        (s, st) for s in ("ours", "sentence-transformers") for st in ("train", "encode")} | {("ours-inline-data", "train"),
                                                                        ("ours-token-cache", "encode")}
    for r in rep["rows"]:
        assert r["examples_per_s"] > 0 and r["host_ms_per_step"] > 0
    ours = next(r for r in rep["rows"] if (r["system"], r["stage"]) == ("ours", "train"))
    assert ours["steps_timed"] == 2 and ours["data_wait_ms_median"] >= 0
    inline = next(r for r in rep["rows"] if r["system"] == "ours-inline-data")
    assert inline["levers"] == ["train.background_loader=False", "train.token_cache=False"]
    assert rep["ratio"]["train"] > 0 and rep["ratio"]["encode"] > 0
    assert rep["max_lengths"] == {"question": 64, "passage": 192}  # the minilm preset's unless --max-lengths
    assert ours["precision"] in ("fp32", "bf16")  # what ran (auto resolved), to compare like for like


def test_bench_overhead_max_lengths_refused_in_one_usage_line(capsys):
    main = script("bench_overhead").main
    for bad in ("16", "0,16", "16,x"):
        with pytest.raises(SystemExit) as info:
            main(["--max-lengths", bad])
        assert info.value.code == 2 and "expected two positive integers Q,P" in capsys.readouterr().err


def test_bench_overhead_gpu_policy_sets_the_cuda_values_and_set_wins(tiny_data_dir, tmp_path):
    """``--gpu-policy``: our rows run with the values ``auto`` takes on CUDA (buckets off, fused AdamW), as the
    trainer's own resolvers give them; a ``--set`` of the same key still wins."""
    mod = script("bench_overhead")
    assert mod.gpu_policy() == {"length_bucket_size": 0, "optimizer_impl": "fused"}
    out = tmp_path / "o.json"
    mod.main(["--data-dir", str(tiny_data_dir), "--data", "tiny", "--batch-size", "2", "--steps", "2", "--skip", "0",
              "--repeat", "1", "--no-peer", "--no-inline", "--gpu-policy", "--set", "optimizer_impl=foreach",
              "--json", str(out)])
    rep = json.loads(out.read_text())
    assert rep["gpu_policy"] is True and rep["train_overrides"] == {"length_bucket_size": 0,
                                                                    "optimizer_impl": "foreach"}
    (ours,) = [r for r in rep["rows"] if r["system"] == "ours"]
    assert ours["levers"] == ["train.length_bucket_size=0", "train.optimizer_impl=foreach"]


def test_pca_truncation_rotation_keeps_the_full_size_and_reports_each_cut(tiny_model_dir, tiny_data_dir, tmp_path):
    """``scripts/pca_truncation.py``: at the model's full size the rotation ranks as the model does (a rotation
    changes no score); each smaller size has both rows and the share its rotated prefix carries."""
    out = tmp_path / "pca.json"
    rep = script("pca_truncation").main(["--model", str(tiny_model_dir), "--data-dir", str(tiny_data_dir),
                                         "--data", "tiny", "--dims", "16,8,32", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(rep))
    full, *cuts = rep["rows"]
    assert full["dim"] == 32 and [r["dim"] for r in cuts] == [16, 8, 32]
    assert cuts[-1]["rotated"] == full["first"] and cuts[-1]["share"] == pytest.approx(1.0)
    assert cuts[1]["share"] <= cuts[0]["share"] <= 1.0
    assert rep["rotation_passages"] == 8 and rep["questions"] > 0
