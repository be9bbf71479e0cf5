"""The one device rule (`dpr.distributed.device`, ``device=`` keys checked by `dpr.distributed.check_device`) is what
every model-running stage uses.

On this CPU-only machine the rule is patched to answer ``meta``: a device that cannot silently be the CPU. Every
``.to(meta)`` of a module or a tensor is recorded and carried out on the CPU instead, so the stages run for real;
a stage that ignores the rule (e.g. ``load_cross_encoder(path, device="cpu")``) never moves its model there and
the test fails.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dpr.distributed as dist
from tests.tiny_negatives import with_negatives
from tests.run_command import run_as_subprocess

REPO = Path(__file__).resolve().parents[1]
FAKE = torch.device("meta")


def _is_fake(x) -> bool:
    return isinstance(x, (str, torch.device)) and torch.device(x).type == FAKE.type


def _swap(args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
    hit = any(_is_fake(a) for a in args) or _is_fake(kwargs.get("device"))
    args = tuple("cpu" if _is_fake(a) else a for a in args)
    if _is_fake(kwargs.get("device")):
        kwargs = {**kwargs, "device": "cpu"}
    return args, kwargs, hit


@pytest.fixture()
def moved(monkeypatch) -> list[tuple[str, str]]:
    """The rule answers ``meta``; returns the list of what was moved there: ``("model", class name)`` and
    ``("tensor", shape)`` entries."""
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(dist, "device", lambda: FAKE)
    module_to, tensor_to = torch.nn.Module.to, torch.Tensor.to

    def spy_module(self, *args, **kwargs):
        args, kwargs, hit = _swap(args, kwargs)
        if hit:
            seen.append(("model", type(self).__name__))
        return module_to(self, *args, **kwargs)

    def spy_tensor(self, *args, **kwargs):
        args, kwargs, hit = _swap(args, kwargs)
        if hit:
            seen.append(("tensor", str(tuple(self.shape))))
        return tensor_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", spy_module)
    monkeypatch.setattr(torch.Tensor, "to", spy_tensor)
    return seen


def _models(seen) -> set[str]:
    return {name for kind, name in seen if kind == "model"}


def _tensors(seen) -> int:
    return sum(kind == "tensor" for kind, _ in seen)


# ---------------------------------------------------------------- the rule and its key


def test_check_device_accepts_the_rule_and_this_processs_devices():
    assert dist.check_device(None) is None and dist.check_device("auto") is None and dist.check_device("AUTO") is None
    assert dist.check_device("cpu") == "cpu"
    assert dist.resolve_device("auto") == dist.device() and dist.resolve_device("cpu") == torch.device("cpu")
    assert dist.available_devices()[0] == "cpu"


@pytest.mark.parametrize("bad", ["tpu", "cuda", "cuda:7", "gpu0", "mps"])
def test_a_device_this_process_cannot_use_is_one_line_naming_the_available_ones(bad):
    if bad == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    if bad == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has 8 GPUs")
    if bad == "mps" and getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        pytest.skip("mps is available here")
    with pytest.raises(ValueError) as err:
        dist.check_device(bad, "device")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"device={bad}:") and "available: auto" in msg and "cpu" in msg


def _encode_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0"}
    return run_as_subprocess([sys.executable, "-m", "dpr.cli.encode", *args], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=300)


@pytest.mark.parametrize("bad", ["tpu", "cuda"])
def test_dpr_encode_with_a_device_it_cannot_use_exits_2_in_one_line(bad, tiny_model_dir, tiny_data_dir, tmp_path):
    if bad == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    out = tmp_path / "vectors"
    proc = _encode_cli(f"model={tiny_model_dir}", f"passages={tiny_data_dir / 'tiny' / 'passages.tsv'}",
                       f"output_dir={out}", f"device={bad}", cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("dpr-encode: error: device=") and "available: auto" in lines[0]
    assert "unexpected" not in proc.stderr
    assert not out.exists() or not any(out.iterdir())  # nothing written


# ---------------------------------------------------------------- every model stage on the rule's device


def _results(data_dir: Path, path: Path) -> Path:
    data = json.loads((data_dir / "tiny" / "train.json").read_text())
    res = [{"question": ex["question"], "answers": ex["answers"],
            "ctxs": [{"id": c["passage_id"], "title": c["title"], "text": c["text"], "score": float(3 - j)}
                     for j, c in enumerate(ex["positive_ctxs"][:1] + ex["hard_negative_ctxs"])]} for ex in data]
    path.write_text(json.dumps(res))
    return path


@pytest.fixture()
def ce_dir(tiny_model_dir, tmp_path) -> Path:
    from dpr.rerank.model import build_cross_encoder, save_cross_encoder

    torch.manual_seed(0)
    model, tok = build_cross_encoder(str(tiny_model_dir))
    return save_cross_encoder(model.eval(), tok, tmp_path / "ce", {"max_length": 64, "title": True})


def test_cross_encoder_training_runs_on_the_rules_device(moved, tiny_model_dir, tiny_data_dir, tmp_path):
    from dpr.rerank.config import RerankConfig
    from dpr.rerank.train import train_cross_encoder

    train = with_negatives(tiny_data_dir, 2)
    cfg = RerankConfig(model=str(tiny_model_dir), max_length=64)
    cfg.train.max_steps, cfg.train.batch_size, cfg.train.negatives, cfg.train.save_every = 1, 2, 2, 0
    cfg.train.precision = "fp32"
    summary = train_cross_encoder(cfg, train, tmp_path / "run")
    assert "BertForSequenceClassification" in _models(moved)  # the model
    assert _tensors(moved) >= 3  # the step's inputs (ids, mask, types, labels)
    assert summary["device"] == "meta"


def test_cross_encoder_validation_scoring_teacher_scores_and_reranking_use_the_rules_device(
        moved, ce_dir, tiny_data_dir, tmp_path):
    from dpr.rerank.model import load_cross_encoder
    from dpr.rerank.pipeline import score_training_candidates
    from dpr.rerank.rerank_file import rerank_file
    from dpr.rerank.stage_config import TeacherStageConfig
    from dpr.rerank.train import as_config

    train = with_negatives(tiny_data_dir, 2)
    # dpr-rerank score (the pipeline's rerank stages load the teacher the same way: the AST test below)
    stats = rerank_file(ce_dir, _results(tiny_data_dir, tmp_path / "res.json"), tmp_path / "out.json", k=3,
                        precision="fp32")
    assert _models(moved) == {"BertForSequenceClassification"} and stats["device"] == "cpu"  # (really run on the CPU)
    moved.clear()
    # teacher scores (the pipeline's teacher_scores stage and dpr-rerank teacher-scores)
    tcfg = TeacherStageConfig(rerank=as_config({"score": {"precision": "fp32"}}))
    score_training_candidates(ce_dir, train, tmp_path / "scores.jsonl", tcfg)
    assert _models(moved) == {"BertForSequenceClassification"}
    moved.clear()
    # the default of every load: the rule (validation runs on the training model, placed by the trainer)
    load_cross_encoder(ce_dir)
    assert _models(moved) == {"BertForSequenceClassification"}


def test_reader_training_and_evaluation_run_on_the_rules_device(moved, tiny_model_dir, tiny_data_dir, tmp_path):
    from dpr.reader.config import ReaderConfig
    from dpr.reader.evaluate import evaluate_reader
    from dpr.trainkit.config_dict import plain

    from dpr.reader.train import train_reader

    train = with_negatives(tiny_data_dir, 2)
    cfg = plain(ReaderConfig(model=str(tiny_model_dir), max_length=64))
    cfg["train"].update(max_steps=1, batch_size=2, negatives=1, save_every=0, precision="fp32")
    cfg["eval"].update(ks=[1], precision="fp32")
    summary = train_reader(cfg, train, tmp_path / "reader")
    assert "Reader" in _models(moved) and _tensors(moved) >= 4  # the model and its four input tensors
    assert summary["device"] == "meta"
    moved.clear()
    evaluate_reader(cfg, tmp_path / "reader", tmp_path / "eval.json",
                    results=_results(tiny_data_dir, tmp_path / "res.json"))
    assert "Reader" in _models(moved)


def test_dual_encoder_training_validation_encode_and_retrieve_use_the_rules_device(
        moved, tiny_model_dir, tiny_data_dir, tmp_path):
    from tests.encode_kw import encode_corpus
    from dpr.retrieval.runs import encode_questions
    from dpr.training.train import train

    cfg = {"model": {"name": str(tiny_model_dir), "pooling": "mean", "question_max_length": 32,
                     "passage_max_length": 64},
           "data": {"name": "tiny", "kind": "qa"}, "logger": {"type": "none"}, "data_dir": str(tiny_data_dir),
           "output_dir": str(tmp_path / "run"), "seed": 7,
           "train": {"batch_size": 4, "hard_negatives": 1, "max_steps": 1, "lr": 1e-3, "warmup_ratio": 0.0,
                     "print_every": 1000, "val_batch_size": 8, "precision": "fp32", "save_every": 0}}
    train(cfg)
    assert "BiEncoder" in _models(moved) and _tensors(moved) >= 2
    moved.clear()
    encode_corpus(tmp_path / "run", tiny_data_dir / "tiny" / "passages.tsv", tmp_path / "vectors", autocast="off",
                  runtime="torch", progress=False, cache_dir=tmp_path / "arrow")
    assert "BiEncoder" in _models(moved)
    moved.clear()
    encode_questions(tmp_path / "run", ["where is paris"], autocast="off")
    assert "BiEncoder" in _models(moved)


def test_no_stage_loads_a_cross_encoder_or_reader_on_a_device_of_its_own():
    """Every call of `load_cross_encoder` / `load_reader` in the package leaves the device to the rule (no
    ``device=`` argument, or one that went through `resolve_device`): the pipeline's rerank stages included."""
    offenders = []
    for path in (REPO / "dpr").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                    "load_cross_encoder", "load_reader"):
                extra = node.args[1:] + [k.value for k in node.keywords if k.arg == "device"]
                if any(not (isinstance(a, ast.Call) and getattr(a.func, "id", "") == "resolve_device") for a in extra):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders
