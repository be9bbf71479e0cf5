"""No bad number gets through training: non-finite losses, gradients and weights stop the run naming the step,
are never saved or kept as best, and validation ranks a non-finite score last, never first."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dpr.training.trainer import TrainingDiverged, check_step_finite, nonfinite_parameters
from dpr.training.train import train
from dpr.training.validation import DevEncoding, Validator, average_rank, corpus_topk_accuracy
from tests.run_command import run_as_subprocess

pytestmark = pytest.mark.usefixtures("one_thread")
BIN = Path(sys.executable).parent


def tiny_cfg(model_dir: Path, data_dir: Path, out: Path, **train_kw) -> dict:
    train_cfg = {"batch_size": 4, "hard_negatives": 1, "max_steps": 3, "lr": 1e-3, "warmup_ratio": 0.0,
                 "print_every": 1000, "val_batch_size": 8, "precision": "fp32", **train_kw}
    return {"model": {"name": str(model_dir), "question_max_length": 32, "passage_max_length": 64},
            "data": {"name": "tiny", "kind": "qa"}, "train": train_cfg, "logger": {"type": "none"},
            "data_dir": str(data_dir), "output_dir": str(out), "seed": 7}


# ---------------------------------------------------------------- the step guard


def test_step_guard_names_the_step_and_what_went_wrong():
    model = torch.nn.Linear(2, 2)
    check_step_finite(5, 0.7, 1.3, model, lr=1e-3)  # all finite: nothing happens
    with pytest.raises(TrainingDiverged, match=r"^training diverged at step 5: the loss is nan"):
        check_step_finite(5, float("nan"), 1.0, model, lr=1e-3)
    with pytest.raises(TrainingDiverged, match=r"step 6: the gradient norm is inf"):
        check_step_finite(6, 0.5, float("inf"), model, lr=1e-3)
    check_step_finite(6, 0.5, float("inf"), model, lr=1e-3, scaled=True)  # fp16: the scaler skips that step
    with torch.no_grad():
        model.bias[1] = float("nan")
    assert nonfinite_parameters(model) == ["bias"]
    with pytest.raises(TrainingDiverged, match=r"step 7: 1 weight tensors are not finite \(first: bias\)"):
        check_step_finite(7, 0.5, 1.0, model, lr=1e-3, scaled=True)
    with torch.no_grad():
        model.bias[1] = 1e30  # finite, but diverged: the fused norm screen overflows
    with pytest.raises(TrainingDiverged, match=r"step 8: the weights' norm overflows"):
        check_step_finite(8, 0.5, 1.0, model, lr=1e-3)
    assert isinstance(TrainingDiverged("x"), ValueError)  # an expected error: the CLI prints one line, exit 2


class _NaNGrad(torch.autograd.Function):
    """Identity forward, NaN gradient backward: a finite loss whose gradient is poison."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, float("nan"))


class PoisonedLoss:
    """DPR's loss, until call ``at`` (1-based: one call per step here): then a NaN loss, or a NaN gradient."""

    def __init__(self, at: int, what: str) -> None:
        from dpr.losses import SoftmaxNLLLoss

        self.inner, self.at, self.what, self.calls = SoftmaxNLLLoss(), at, what, 0

    def __call__(self, q, p, masks, similarity, gather=True):
        self.calls += 1
        if self.calls >= self.at:
            q = _NaNGrad.apply(q) if self.what == "grad" else q * float("nan")
        return self.inner(q, p, masks, similarity, gather=gather)


@pytest.mark.parametrize("lagged", [False, True], ids=["rows-now", "rows-lagged"])  # lagged: a CUDA device's rule
@pytest.mark.parametrize("what,problem", [("loss", "the loss is nan"), ("grad", "the gradient norm is nan")])
def test_a_diverging_run_stops_at_the_step_and_saves_nothing_non_finite(tiny_model_dir, tiny_data_dir, tmp_path,
                                                                         monkeypatch, what, problem, lagged):
    # before: the run went on, saved NaN weights and kept them as the best with dev avg_rank 0 / MRR 1.0
    monkeypatch.setattr("dpr.training.trainer.lagged_logging", lambda device: lagged)
    out = tmp_path / "run"
    cfg = tiny_cfg(tiny_model_dir, tiny_data_dir, out, max_steps=4, save_every=1, eval_every=1)
    cfg["loss"] = {"_target_": f"{__name__}.PoisonedLoss", "at": 3, "what": what}
    with pytest.raises(TrainingDiverged) as info:
        train(cfg)
    assert str(info.value).startswith(f"training diverged at step 3: {problem}") and "\n" not in str(info.value)
    assert not (out / "train_summary.json").exists() and not (out / "biencoder.json").exists()
    from safetensors.torch import load_file

    from dpr.trainkit.checkpoint import read_best

    saved = sorted(out.rglob("*.safetensors"))
    assert saved, "the steps before the divergence were checkpointed"
    for f in saved:  # every checkpoint and the best weights are finite
        assert all(torch.isfinite(t).all() for t in load_file(f).values()), f
    assert read_best(out)["step"] <= 2 and math.isfinite(read_best(out)["value"])
    import json

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows if "loss" in r)


def test_cli_refuses_inf_lr_and_reports_divergence_in_one_line(tiny_model_dir, tiny_data_dir, tmp_path):
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "tiny.yaml").write_text("name: tiny\nkind: qa\n")
    env = dict(os.environ, WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    # the poisoned loss below is this module's (``tests.training.test_nonfinite``): importable by the command
    # from the root that holds this ``tests`` package, ahead of any other checkout's on PYTHONPATH
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))

    def run(out: Path, *extra: str) -> subprocess.CompletedProcess:
        return run_as_subprocess([str(BIN / "dpr-train"), "--config-dir", str(conf), "data=tiny",
                                  f"data_dir={tiny_data_dir}", f"output_dir={out}", "model=tiny",
                                  f"model.name={tiny_model_dir}", "train.batch_size=4", "train.val_batch_size=8",
                                  "train.precision=fp32", *extra], env=env, capture_output=True, text=True, timeout=300)

    proc = run(tmp_path / "inf", "train.lr=inf", "train.max_steps=3")
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dpr-train")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "train.lr" in lines[0] and "got inf" in lines[0] and "(0, 1]" in lines[0]
    assert not (tmp_path / "inf" / "train_summary.json").exists()
    proc = run(tmp_path / "warm", "train.warmup_ratio=2", "train.max_steps=3")
    assert proc.returncode == 2 and "train.warmup_ratio" in proc.stderr and "[0, 1]" in proc.stderr

    # a legal but extreme temperature (1e-4 x 1e-16: refused now; below, scores overflow) ...
    proc = run(tmp_path / "temp", "model.temperature=1e-20", "train.max_steps=3")
    assert proc.returncode == 2 and "model.temperature" in proc.stderr and "[0.0001, 10000]" in proc.stderr
    # ... and a run that diverges: one line naming the step, no finished run left behind
    proc = run(tmp_path / "div", f"loss._target_={__name__}.PoisonedLoss", "+loss.at=2", "+loss.what=loss",
               "train.max_steps=3")
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dpr-train")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "training diverged at step 2: the loss is nan" in lines[0]
    assert not (tmp_path / "div" / "train_summary.json").exists()


# ---------------------------------------------------------------- validation


def _examples() -> list[dict]:
    ctx = lambda pid: {"passage_id": pid, "title": "", "text": f"text {pid}"}  # noqa: E731
    return [{"question": f"q{i}", "answers": [], "positive_ctxs": [ctx(f"p{i}")],
             "hard_negative_ctxs": [ctx(f"p{(i + 1) % 3}"), ctx(f"p{(i + 2) % 3}")], "negative_ctxs": []}
            for i in range(3)]


def _scorer(fill):
    # a model whose similarity is the given score matrix rule (diverged weights give NaN everywhere)
    return SimpleNamespace(similarity=lambda q, p: fill(q @ p.T))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_validation_ranks_a_non_finite_score_last(bad):
    ex = _examples()
    q, p = torch.eye(3), torch.eye(3)  # question i's positive p_i scores 1, the others 0
    ids = ["p0", "p1", "p2"]
    good = average_rank(_scorer(lambda s: s), None, ex, question_vectors=q, known_passages=(ids, p))
    assert good["avg_rank"] == 0 and good["mrr"] == 1
    # every score non-finite (what NaN weights give): before, NaN ranked first, avg_rank 0, MRR 1.0
    allbad = average_rank(_scorer(lambda s: torch.full_like(s, bad)), None, ex, question_vectors=q,
                          known_passages=(ids, p))
    assert allbad["avg_rank"] == 2 and allbad["mrr"] == pytest.approx(1 / 3)
    # only a negative is non-finite: it beats nobody
    one = _scorer(lambda s: torch.where(torch.eye(3, dtype=torch.bool).roll(1, dims=1), torch.tensor(bad), s))
    assert average_rank(one, None, ex, question_vectors=q, known_passages=(ids, p))["avg_rank"] == 0
    corpus = (ids, ["text p0", "text p1", "text p2"], ["", "", ""])
    top = corpus_topk_accuracy(_scorer(lambda s: torch.full_like(s, bad)), None, ex, corpus, ks=[1, 3],
                               use_answers=False, question_vectors=q, passage_vectors=p)
    assert top["top1"] == 0 and top["top3"] == 0  # no result at all, not a hit


def test_a_non_finite_metric_is_never_the_best():
    v = Validator(None, [], corpus=None, use_answers=True, cfg={}, encoding=DevEncoding(8, 8),
                  primary_metric="avg_rank")
    assert not v.is_better("avg_rank", float("nan"), None)
    assert not v.is_better("mrr", float("nan"), 0.5)
    assert v.is_better("avg_rank", 3.0, None) and v.is_better("avg_rank", 2.0, 3.0)
