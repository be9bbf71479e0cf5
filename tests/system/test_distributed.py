"""Two gloo processes under torchrun compute the same loss and gradients as one process with the global batch."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dpr import distributed as D
from dpr.losses import build_loss
from dpr.training.steps import standard_step

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("ddp_worker", HERE / "ddp_worker.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_single_process_helpers():
    assert not D.is_distributed() and D.rank() == 0 and D.world_size() == 1 and D.is_main()
    t = torch.randn(3, 2)
    assert D.all_gather_with_grad(t) is t
    assert D.all_gather_object({"a": 1}) == [{"a": 1}]
    assert D.all_gather_sizes(5) == [5]
    assert D.reduce_mean(torch.tensor(2.5)) == 2.5
    D.barrier()  # no-op


def test_init_without_torchrun_env(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert D.init_distributed() is False
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert D.init_distributed() is False


@pytest.fixture(scope="module")
def ddp_run(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        str(HERE / "ddp_worker.py"), "--model-dir", str(tiny_model_dir), "--out-dir", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def reference(tiny_model_dir, loss_name):
    """One process holding the whole global batch (ranks' slices concatenated in rank order)."""
    model, tok = worker.build(str(tiny_model_dir))
    q, p = worker.batch(tok, worker.QUESTIONS, worker.PASSAGES)
    loss, masks = build_loss(worker.LOSSES[loss_name]), worker.global_masks()
    out = standard_step(model, q, p, lambda qv, pv: loss(qv, pv, masks, model.similarity))
    return out, worker.grads_of(model)


@pytest.mark.slow
@pytest.mark.parametrize("loss_name", sorted(worker.LOSSES))
@pytest.mark.parametrize("step", ["standard", "cache"])
def test_two_processes_match_one_process(ddp_run, tiny_model_dir, loss_name, step):
    ref_out, ref_grads = reference(tiny_model_dir, loss_name)
    figures = [json.loads((ddp_run / f"rank{r}_{loss_name}_{step}.json").read_text()) for r in range(2)]
    # Each rank's loss is over its own questions against the global pool; their mean is the global loss.
    assert sum(f["loss"] for f in figures) / 2 == pytest.approx(ref_out.loss.item(), abs=1e-5)
    assert sum(f["accuracy"] for f in figures) / 2 == pytest.approx(ref_out.accuracy)
    assert sum(f["avg_rank"] for f in figures) / 2 == pytest.approx(ref_out.avg_rank)
    assert all(f["n"] == len(worker.PASSAGES) == ref_out.num_candidates for f in figures)
    for r in range(2):
        got = load_file(str(ddp_run / f"rank{r}_{loss_name}_{step}.safetensors"))
        assert got.keys() == ref_grads.keys() and len(got) > 10
        for name, g in ref_grads.items():
            # relative to the tensor's scale, not each element's: fp32 summation-order noise in a tensor
            # that sums many tokens' gradients (embeddings) is ~1e-6 of its largest entry (margin_mse's
            # squared margins give gradients ~15); a wrong gather or scaling is off by O(1)
            err = (got[name] - g).abs().max().item()
            assert err <= 1e-5 + 1e-5 * g.abs().max().item(), (r, name, err)


def test_gather_helpers_with_unequal_sizes(ddp_run):
    for r in range(2):
        res = json.loads((ddp_run / f"rank{r}_gather.json").read_text())
        assert res["gathered"] == [[0.0] * 3, [1.0] * 3, [1.0] * 3]  # rank 0 gave 1 row, rank 1 two
        # Both ranks' losses weigh row k by its index; the adjoint sums them: grad = 2 * weights[slice].
        rows = {0: [[0, 1, 2]], 1: [[3, 4, 5], [6, 7, 8]]}[r]
        assert res["local_grad"] == [[2.0 * v for v in row] for row in rows]
        assert res["objects"] == [{"rank": 0}, {"rank": 1}]
        assert res["mean"] == 0.5 and res["env_world"] == 2
