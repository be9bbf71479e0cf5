"""dpr.trainkit: the one precision rule under both CPU rules, ``plain(cfg)``, seeding, and the shared checkpoint,
optimizer and metrics pieces the retriever's, the reader's and the cross-encoder's trainers use."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import random

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dpr.trainkit import checkpoint as ckpt
from dpr.trainkit.config_dict import plain
from dpr.trainkit.metrics_log import METRICS_FILE, VALIDATION_FILE, MetricsLogger, read_jsonl
from dpr.trainkit.optim import apply_update, build_optimizer, clip_gradients, linear_schedule
from dpr.trainkit.precision import (autocast_context, autocast_dtype, autocast_factory, autocast_scope,
                                    precision_context, resolve_precision)
from dpr.trainkit.seed import rng_state, seed_everything, set_rng_state

CPU = torch.device("cpu")


@pytest.fixture(params=["no_bf16", "force_bf16"])
def rule(request, monkeypatch) -> str:
    """Each CPU rule ``auto`` can follow, whatever this machine has (dpr.perf.cpu's two switches)."""
    if request.param == "no_bf16":
        monkeypatch.delenv("DPR_FORCE_BF16", raising=False)
        monkeypatch.setenv("DPR_NO_BF16", "1")
    else:
        monkeypatch.delenv("DPR_NO_BF16", raising=False)
        monkeypatch.setenv("DPR_FORCE_BF16", "1")
    return request.param


def _inside(ctx) -> torch.dtype | None:
    with ctx:
        return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None


@pytest.mark.parametrize("precision", ["auto", "fp32", "bf16"])
def test_the_precision_rule_under_both_cpu_rules(rule, precision, caplog):
    want = {"fp32": "fp32", "bf16": "bf16", "auto": "bf16" if rule == "force_bf16" else "fp32"}[precision]
    dtype = {"fp32": None, "bf16": torch.bfloat16}[want]
    assert resolve_precision(precision, CPU) == want
    assert autocast_dtype(CPU, precision) is dtype
    with caplog.at_level(logging.WARNING, logger="dpr.trainkit.precision"):
        assert resolve_precision(precision, CPU, training=True) == want
    # bf16 asked for by name on a CPU the rule says has none: trained all the same, with a warning
    warned = "no native bf16" in caplog.text
    assert warned == (precision == "bf16" and rule == "no_bf16")
    ctx, resolved = precision_context(precision, CPU, training=True)
    assert resolved == want and _inside(ctx) is dtype
    assert _inside(autocast_context(CPU, precision)) is dtype
    factory = autocast_factory(CPU, precision)
    assert (factory is None) == (dtype is None)
    if factory is not None:
        assert factory() is not factory() and _inside(factory()) is dtype  # a fresh context per call


def test_every_trainer_and_encoder_resolves_precision_with_the_one_rule():
    """No second rule left: the encoder, the bf16-weights lever, ONNX's runtime choice, the reader and the
    cross-encoder all call the kit's functions."""
    import dpr.models.inference as inference
    import dpr.models.onnx_runtime as onnx_runtime
    import dpr.models.weights as weights
    import dpr.reader.infer as reader_infer
    import dpr.reader.model as reader_model
    import dpr.rerank.rerank_file as rerank_file
    import dpr.rerank.score as rerank_score
    import dpr.training.train as trainer

    assert inference.autocast_context is autocast_context and reader_infer.autocast_context is autocast_context
    assert weights.autocast_dtype is autocast_dtype and onnx_runtime.autocast_dtype is autocast_dtype
    assert rerank_score.autocast_context is autocast_context and rerank_file.resolve_precision is resolve_precision
    assert trainer.resolve_precision is resolve_precision
    assert not hasattr(reader_model, "autocast_context") and not hasattr(rerank_score, "precision_context")
    assert not hasattr(inference, "autocast_dtype") and not hasattr(trainer, "_autocast")


def test_aliases_fp16_and_bad_values(monkeypatch):
    monkeypatch.setenv("DPR_NO_BF16", "1")
    monkeypatch.delenv("DPR_FORCE_BF16", raising=False)
    for off in (None, "off", "none", "false", "FP32"):
        assert resolve_precision(off, CPU) == "fp32" and autocast_dtype(CPU, off) is None
    assert resolve_precision("bfloat16", CPU) == "bf16" and resolve_precision("float16", CPU) == "fp16"
    assert resolve_precision("fp16", CPU) == "fp16"  # inference may autocast to fp16 on the CPU ...
    with pytest.raises(ValueError, match="fp16 needs a GPU"):  # ... training may not (no loss scaling)
        resolve_precision("fp16", CPU, training=True)
    with pytest.raises(ValueError, match="autocast must be auto, bf16, fp16 or off"):
        resolve_precision("fp8", CPU)
    assert autocast_dtype("meta", "auto") is None  # neither CUDA nor a CPU: auto is full precision


def test_autocast_scope_takes_a_factory_a_context_or_none():
    ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    assert autocast_scope(ctx) is ctx
    assert isinstance(autocast_scope(None), contextlib.nullcontext)
    made = []
    assert autocast_scope(lambda: made.append(1) or ctx) is ctx and made == [1]


# ---------------------------------------------------------------- plain(cfg)

@dataclasses.dataclass
class _Cfg:
    lr: float = 1e-3
    layers: tuple = (1, 2)
    name: str = "x"


def test_plain_on_omegaconf_dataclasses_and_mappings():
    node = OmegaConf.create({"data": {"name": "tiny"}, "out": "${data.name}/run", "ks": [1, 2]})
    got = plain(node)
    assert got == {"data": {"name": "tiny"}, "out": "tiny/run", "ks": [1, 2]} and type(got) is dict
    assert type(got["data"]) is dict and type(got["ks"]) is list
    assert plain(node.ks) == [1, 2] and plain(node.data) == {"name": "tiny"}
    assert plain(_Cfg()) == {"lr": 1e-3, "layers": (1, 2), "name": "x"}
    # a mapping: nested nodes and interpolations resolved, tuples as lists (what train() always made of it)
    mixed = {"model": OmegaConf.create({"name": "m"}), "seed": 3, "dir": "${model.name}", "betas": (0.9, 0.99)}
    assert plain(mixed) == {"model": {"name": "m"}, "seed": 3, "dir": "m", "betas": [0.9, 0.99]}
    d = {"a": {"b": 1}}
    assert plain(d) == d and plain(d) is not d and plain(d)["a"] is not d["a"]  # a copy: the caller's is never touched
    assert plain(None) is None and plain(3) == 3 and plain("s") == "s"


# ---------------------------------------------------------------- seeding

def _draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_seeding_is_deterministic():
    seed_everything(11)
    a = _draws()
    seed_everything(11)
    assert _draws() == a
    seed_everything(12)
    assert _draws() != a
    seed_everything(5)
    state = rng_state()
    b = _draws()
    _draws()
    set_rng_state(state)
    assert _draws() == b
    # through a checkpoint's torch.save / torch.load(weights_only=True)
    set_rng_state(torch.load(_saved(state), weights_only=True))
    assert _draws() == b


def _saved(state: dict):
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf


# ---------------------------------------------------------------- checkpoints, fingerprints, resume

def test_fingerprints_are_the_formula_every_run_was_written_with(tmp_path):
    """Existing checkpoints stay resumable: the kit's fingerprint is the trainers' old sha256 of sorted JSON."""
    blob = {"model": "m", "train": {"lr": 1e-3, "betas": [0.9, 0.99]}, "path": tmp_path}
    old = hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert ckpt.fingerprint(blob) == old
    f = tmp_path / "train.json"
    f.write_text("[]")
    assert ckpt.file_identity(f) == [f.stat().st_size, f.stat().st_mtime_ns]


def test_the_resumable_key_sets_are_the_trainers_old_ones():
    from dpr.rerank.train import _RESUMABLE as rerank_keys
    from dpr.training.resume import RESUMABLE_KEYS as retriever_keys

    reader_old = {"max_steps", "epochs", "save_every", "keep_checkpoints", "resume", "log_every", "cpu_threads"}
    assert ckpt.RESUMABLE_KEYS == reader_old
    assert rerank_keys == reader_old | {"eval_every", "val_max_questions", "best_metric"}
    assert retriever_keys == {"epochs", "max_steps", "save_every", "keep_checkpoints", "log_every", "print_every",
                              "eval_every", "resume", "validate", "best_metric", "cpu_threads", "optimizer_impl"}
    # (the pipeline's rounds and remine_* keys were resumable too: they are no longer TrainConfig's)


def _tiny():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    opt = build_optimizer(model, lr=1e-2, weight_decay=0.01)
    return model, opt, linear_schedule(opt, 1, 10)


def test_resume_checkpoint_loads_its_runs_past_and_ignores_or_refuses_another(tmp_path, caplog):
    model, opt, sched = _tiny()
    model(torch.ones(2, 4)).sum().backward()
    apply_update(model.parameters(), opt, sched, 1.0)
    ckpt.save_checkpoint(tmp_path, 1, model, opt, sched, None, {"fingerprint": "aaaa", "best": 0.5}, [rng_state()])
    again, opt2, sched2 = _tiny()
    step, state = ckpt.resume_checkpoint("auto", tmp_path, "aaaa", again, opt2, sched2)
    assert step == 1 and state["best"] == 0.5 and torch.equal(again[0].weight, model[0].weight)
    assert sched2.get_last_lr() == sched.get_last_lr()
    assert ckpt.resume_checkpoint("false", tmp_path, "aaaa", *_tiny()) == (0, {})
    with caplog.at_level(logging.WARNING, logger="dpr.trainkit.checkpoint"):
        assert ckpt.resume_checkpoint("auto", tmp_path, "bbbb", *_tiny()) == (0, {})
    assert "written by a run with other settings" in caplog.text
    with pytest.raises(ValueError, match="checkpoint of a different run"):
        ckpt.resume_checkpoint("true", tmp_path, "bbbb", *_tiny())


def test_apply_update_is_clip_step_schedule(tmp_path):
    a, opt_a, sched_a = _tiny()
    b, opt_b, sched_b = _tiny()
    for m in (a, b):
        (m(torch.arange(8.0).view(2, 4)) ** 2).sum().backward()
    lr, norm = apply_update(a.parameters(), opt_a, sched_a, 0.5)
    want_lr = sched_b.get_last_lr()[0]
    want_norm = clip_gradients(b.parameters(), 0.5)
    opt_b.step()
    sched_b.step()
    opt_b.zero_grad(set_to_none=True)
    assert (lr, norm) == (want_lr, want_norm)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert all(p.grad is None for p in a.parameters()) and sched_a.get_last_lr() == sched_b.get_last_lr()


def test_metrics_log_without_validation_and_on_resume(tmp_path):
    log = MetricsLogger(tmp_path, validation=False)
    for step in (1, 2, 3):
        log.log_train(step, {"loss": torch.tensor(0.5), "lr": 0.1})
    log.close()
    assert not (tmp_path / VALIDATION_FILE).exists()
    assert read_jsonl(tmp_path / METRICS_FILE)[0] == {"step": 1, "loss": 0.5, "lr": 0.1}
    log = MetricsLogger(tmp_path, resume_step=2, validation=False)  # step 3 is logged again by the resumed run
    log.log_train(3, {"loss": 0.25})
    log.close()
    assert [r["step"] for r in read_jsonl(tmp_path / METRICS_FILE)] == [1, 2, 3]
    MetricsLogger(tmp_path).close()  # a fresh run starts empty files
    assert read_jsonl(tmp_path / METRICS_FILE) == [] and (tmp_path / VALIDATION_FILE).is_file()
