"""The cross-encoder and the reader train data-parallel under ``torchrun`` (`dpr.trainkit.data_parallel`): two gloo
processes compute the one-process losses and weights (the global batch is the config's, whatever the process
count; 3 questions per step split 2 + 1, so each rank's part of the mean is weighed by its share), resume as one
process does, and only rank 0 writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dpr.trainkit.data_parallel import share
from tests.tiny_negatives import with_negatives

REPO = Path(__file__).resolve().parents[2]


def test_shares_are_contiguous_cover_every_item_once_and_differ_by_at_most_one():
    items = list(range(7))
    parts = [share(items, r, 3) for r in range(3)]
    assert parts == [[0, 1], [2, 3], [4, 5, 6]] and sum(parts, []) == items
    assert share(items, 0, 1) == items


def _torchrun(module: str, args: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", module, *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _killed_after_step_2(run: Path, final: str) -> None:
    """What a run killed after its step-2 checkpoint leaves (the same schedule: max_steps is not changed)."""
    shutil.rmtree(run / "checkpoints" / "step_4")
    shutil.rmtree(run / final)
    (run / "train_summary.json").unlink()


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _same_weights(a: dict, b: dict, noise_only: tuple[str, ...] = ()) -> None:
    """Equal up to float rounding. ``noise_only``: parameters whose exact gradient is 0, so that their gradient is
    rounding noise of either run, which Adam turns into steps of up to lr each: compared to lr x steps."""
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=4e-4 if k in noise_only else 2e-5, msg=k)


@pytest.mark.slow
def test_cross_encoder_two_processes_equal_one_and_resume(tiny_model_no_dropout, tiny_data_dir, tmp_path):
    from dpr.rerank.config import RerankConfig
    from dpr.rerank.train import train_cross_encoder

    train = with_negatives(tiny_data_dir)
    work = tmp_path / "cwd"
    work.mkdir()
    ddp = tmp_path / "ddp"
    common = ["train", "data.name=tiny", f"data_dir={tiny_data_dir}", f"output_dir={ddp}", f"model={tiny_model_no_dropout}",
              "rerank.max_length=64", "rerank.train.batch_size=3", "rerank.train.negatives=2", "rerank.train.lr=1e-4",
              "rerank.train.save_every=2", "rerank.train.keep_checkpoints=5", "rerank.train.precision=fp32",
              "rerank.train.warmup_ratio=0.0", "rerank.train.length_bucket_size=4"]
    _torchrun("dpr.cli.rerank", [*common, "rerank.train.max_steps=4"], work)
    _killed_after_step_2(ddp, "cross_encoder")
    _torchrun("dpr.cli.rerank", [*common, "rerank.train.max_steps=4"], work)  # resumes from step 2

    cfg = RerankConfig(model=str(tiny_model_no_dropout), max_length=64)
    t = cfg.train
    t.batch_size, t.negatives, t.lr, t.max_steps, t.save_every, t.precision, t.warmup_ratio = 3, 2, 1e-4, 4, 2, "fp32", 0.0
    t.length_bucket_size = 4
    train_cross_encoder(cfg, train, tmp_path / "one")

    summary = json.loads((ddp / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["resumed_from_step"] == 2 and summary["steps"] == 4
    ddp_rows, one_rows = _rows(ddp / "metrics.jsonl"), _rows(tmp_path / "one" / "metrics.jsonl")
    assert [r["step"] for r in ddp_rows] == [1, 2, 3, 4]
    assert [r["loss"] for r in ddp_rows] == pytest.approx([r["loss"] for r in one_rows], abs=1e-5)
    assert [r["accuracy"] for r in ddp_rows] == pytest.approx([r["accuracy"] for r in one_rows], abs=1e-6)
    enc = "cross_encoder/encoder/model.safetensors"
    # the listwise loss is blind to a constant added to all of a question's scores: the classifier's bias has no
    # gradient but rounding noise, which Adam turns into steps of up to lr (seen on an AMX Xeon: 4.9e-5 after 4 steps)
    _same_weights(load_file(str(ddp / enc)), load_file(str(tmp_path / "one" / enc)), noise_only=("classifier.bias",))
    assert len(torch.load(ddp / "checkpoints" / "step_4" / "rng.pt", weights_only=True)) == 2  # each rank's state
    assert list(work.iterdir()) == []  # no rank wrote anywhere else


@pytest.mark.slow
def test_reader_two_processes_equal_one_and_resume(tiny_model_no_dropout, tiny_data_dir, tmp_path):
    from dpr.reader.config import ReaderConfig
    from dpr.reader.train import train_reader
    from dpr.trainkit.config_dict import plain

    train = with_negatives(tiny_data_dir)
    work = tmp_path / "cwd"
    work.mkdir()
    ddp = tmp_path / "ddp"
    common = ["train", "data.name=tiny", f"data_dir={tiny_data_dir}", f"output_dir={ddp}", f"model={tiny_model_no_dropout}",
              "reader_cfg.max_length=64", "reader_cfg.train.batch_size=3", "reader_cfg.train.negatives=1",
              "reader_cfg.train.lr=1e-4", "reader_cfg.train.save_every=2", "reader_cfg.train.keep_checkpoints=5",
              "reader_cfg.train.precision=fp32", "reader_cfg.train.warmup_ratio=0.0"]
    _torchrun("dpr.cli.reader", [*common, "reader_cfg.train.max_steps=4"], work)
    _killed_after_step_2(ddp, "reader")
    _torchrun("dpr.cli.reader", [*common, "reader_cfg.train.max_steps=4"], work)  # resumes from step 2

    cfg = plain(ReaderConfig(model=str(tiny_model_no_dropout), max_length=64))
    cfg["train"].update(batch_size=3, negatives=1, lr=1e-4, max_steps=4, save_every=2, keep_checkpoints=5,
                        precision="fp32", warmup_ratio=0.0)
    train_reader(cfg, train, tmp_path / "one")

    summary = json.loads((ddp / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["resumed_from_step"] == 2 and summary["steps"] == 4
    ddp_rows, one_rows = _rows(ddp / "metrics.jsonl"), _rows(tmp_path / "one" / "metrics.jsonl")
    assert [r["step"] for r in ddp_rows] == [1, 2, 3, 4]
    for key in ("loss", "span_loss", "relevance_loss", "relevance_accuracy"):
        assert [r[key] for r in ddp_rows] == pytest.approx([r[key] for r in one_rows], abs=1e-5), key
    # the heads' biases shift every candidate of a softmax alike (the relevance over slots, start and end over
    # the passage tokens): no gradient in exact arithmetic
    _same_weights(load_file(str(ddp / "reader" / "reader_head.safetensors")),
                  load_file(str(tmp_path / "one" / "reader" / "reader_head.safetensors")),
                  noise_only=("qa_classifier.bias", "qa_outputs.bias"))
    _same_weights(load_file(str(ddp / "reader" / "encoder" / "model.safetensors")),
                  load_file(str(tmp_path / "one" / "reader" / "encoder" / "model.safetensors")))
    assert len(torch.load(ddp / "checkpoints" / "step_4" / "rng.pt", weights_only=True)) == 2
    assert list(work.iterdir()) == []


def test_a_batch_smaller_than_the_process_count_is_one_line(monkeypatch):
    from dpr import distributed as dist
    from dpr.trainkit.data_parallel import check_batch

    monkeypatch.setattr(dist, "world_size", lambda: 4)
    with pytest.raises(ValueError, match=r"rerank.train.batch_size=3 questions per step is fewer than the 4 processes"):
        check_batch(3, "rerank.train.batch_size")
    check_batch(4, "rerank.train.batch_size")
