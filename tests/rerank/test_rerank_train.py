"""Training the cross-encoder: a real subprocess SIGKILLed mid-training resumes to the weights of an
uninterrupted run, and ``dpr-rerank train`` + ``score`` run end to end on the tiny dataset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.system.test_faults import _env, _run, _run_stopped_at
from tests.tiny_negatives import with_negatives
from tests.run_command import run_as_subprocess

CLI = [sys.executable, "-m", "dpr.cli.rerank"]


def _dev_results(data: list[dict], path: Path) -> Path:
    """A first stage's dev top 4: the positive third, below three negatives."""
    res = [{"question": ex["question"], "answers": ex["answers"],
            "ctxs": [{"id": c["passage_id"], "title": c["title"], "text": c["text"], "score": float(10 - j)}
                     for j, c in enumerate(ex["hard_negative_ctxs"][:2] + ex["positive_ctxs"] + ex["hard_negative_ctxs"][2:])]}
           for ex in data]
    path.write_text(json.dumps(res))
    return path


def _args(tiny_data_dir: Path, tiny_model_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "data.name=tiny", f"data_dir={tiny_data_dir}", f"output_dir={out}", f"model={tiny_model_dir}",
            "rerank.max_length=64", "rerank.train.batch_size=3", "rerank.train.negatives=2", "rerank.train.lr=1e-3",
            "rerank.train.max_steps=6", "rerank.train.save_every=2", "rerank.train.keep_checkpoints=5",
            "rerank.train.precision=fp32", "rerank.train.cpu_threads=1", *extra]


def _weights(out: Path) -> dict:
    return load_file(str(out / "cross_encoder" / "encoder" / "model.safetensors"))


@pytest.mark.slow
def test_killed_training_resumes_to_the_weights_of_an_uninterrupted_run(tiny_data_dir, tiny_model_dir, tmp_path):
    with_negatives(tiny_data_dir)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    _run(CLI + _args(tiny_data_dir, tiny_model_dir, straight), tmp_path)
    # frozen just after the second checkpoint (step 4) was written, then SIGKILLed there
    stopped = _run_stopped_at("dpr.rerank.train:save_checkpoint", "after-2", "dpr.cli.rerank:main",
                              _args(tiny_data_dir, tiny_model_dir, killed), tmp_path)
    assert "4" in stopped
    assert not (killed / "cross_encoder").exists() and not (killed / "checkpoints" / "step_6").exists()
    _run(CLI + _args(tiny_data_dir, tiny_model_dir, killed), tmp_path)
    summary = json.loads((killed / "train_summary.json").read_text())
    assert summary["resumed_from_step"] == 4 and summary["steps"] == 6
    a, b = _weights(straight), _weights(killed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the metrics log holds each step once, as the straight run's does
    rows = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref]


def test_other_settings_do_not_resume_from_old_checkpoints(tiny_data_dir, tiny_model_dir, tmp_path):
    from dpr.rerank.config import RerankConfig
    from dpr.rerank.train import train_cross_encoder

    with_negatives(tiny_data_dir)
    train = tiny_data_dir / "tiny" / "train.json"
    cfg = RerankConfig(model=str(tiny_model_dir), max_length=64)
    cfg.train.max_steps, cfg.train.batch_size, cfg.train.negatives, cfg.train.save_every = 2, 4, 2, 2
    cfg.train.precision = "fp32"
    assert train_cross_encoder(cfg, train, tmp_path / "run")["resumed_from_step"] == 0
    cfg.train.max_steps = 3  # more steps: the same run, continued
    assert train_cross_encoder(cfg, train, tmp_path / "run")["resumed_from_step"] == 2
    cfg.train.loss = "bce"   # another loss: not this run's past, and a finished run is refused
    before = (tmp_path / "run" / "train_summary.json").read_bytes()
    with pytest.raises(ValueError, match=r"finished run trained with other settings.*train.loss: 'listwise' -> 'bce'"
                                         r".*overwrite=true"):
        train_cross_encoder(cfg, train, tmp_path / "run")
    assert (tmp_path / "run" / "train_summary.json").read_bytes() == before  # nothing touched
    assert train_cross_encoder(cfg, train, tmp_path / "run", overwrite=True)["resumed_from_step"] == 0


def test_cli_trains_validates_and_reranks_end_to_end(tiny_data_dir, tiny_model_dir, tmp_path):
    data = json.loads(with_negatives(tiny_data_dir).read_text())
    dev = _dev_results(data, tmp_path / "dev.json")
    out = tmp_path / "run"
    _run(CLI + _args(tiny_data_dir, tiny_model_dir, out, f"dev_results={dev}", "rerank.train.eval_every=2",
                     "rerank.train.max_steps=4", "rerank.score.k=4"), tmp_path)
    summary = json.loads((out / "train_summary.json").read_text())
    val = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    assert [r["step"] for r in val] == [2, 4] and {"top1", "mrr"} <= set(val[0]) and "top5" not in val[0]
    best = max(val, key=lambda r: r["mrr"])  # ties: the first (a later equal value does not replace it)
    assert summary["best"]["metric"] == "mrr" and summary["best"]["step"] == best["step"]
    assert summary["best"]["value"] == best["mrr"]
    # the saved model is the best dev weights
    best_weights = load_file(str(out / "checkpoints" / "best" / "model.safetensors"))
    final = _weights(out)
    assert all(torch.equal(best_weights[k], final[k]) for k in final)

    reranked = tmp_path / "reranked.json"
    proc = run_as_subprocess(CLI + ["score", f"model={out}", f"results={dev}", f"output={reranked}",
                                    "rerank.score.k=3", "rerank.score.precision=fp32"], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1].split(" ", 2)[2])
    assert stats["questions"] == 8 and stats["precision"] == "fp32" and stats["seconds_per_question"] > 0
    assert set(stats["before"]) == {"top1", "mrr"} and stats["before"]["top1"] == 0.0  # positive third
    rows = json.loads(reranked.read_text())
    first = json.loads(dev.read_text())
    for new, old in zip(rows, first):  # the top 3 reordered by the logit, the 4th where the first stage had it
        assert [c["id"] for c in new["ctxs"][3:]] == [c["id"] for c in old["ctxs"][3:]] and len(new["ctxs"]) == 4
        assert sorted(c["id"] for c in new["ctxs"][:3]) == sorted(c["id"] for c in old["ctxs"][:3])
        top = [c["score"] for c in new["ctxs"][:3]]
        assert top == sorted(top, reverse=True) and top == [c["rerank_logit"] for c in new["ctxs"][:3]]
    proc = run_as_subprocess(CLI + ["score", f"model={tmp_path}", f"results={dev}", f"output={reranked}"],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "not a cross-encoder directory" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1

    # teacher-scores: the trained cross-encoder's scores of each training question's positive + first 2 negatives
    from dpr.training.teacher_scores import candidates_of, read_teacher_scores

    scores = tmp_path / "ts" / "teacher_scores.jsonl"
    proc = run_as_subprocess(CLI + ["teacher-scores", f"model={out}", f"data_dir={tiny_data_dir}", "data.name=tiny",
                                    f"output={scores}", "max_negatives=2", "rerank.score.precision=fp32"],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train_json = tiny_data_dir / "tiny" / "train.json"
    train = json.loads(train_json.read_text())
    store = read_teacher_scores(scores, train_json)
    assert store.manifest["questions"] == len(train)
    assert all(set(store.by_question[ex["question"]]) == {c["passage_id"] for c in candidates_of(ex, 2)}
               for ex in train)
    proc = run_as_subprocess(CLI + ["teacher-scores", f"model={out}", f"output={scores}", "max_negatives=-1"],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "max_negatives" in proc.stderr and "Traceback" not in proc.stderr
