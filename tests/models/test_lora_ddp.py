"""2-process gloo DDP with LoRA equals one process holding the global batch: a tiny Llama with adapters on q/v and
last-token pooling, every loss of tests/system/ddp_worker.py, the standard step and the gradient cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from dpr.losses import build_loss
from dpr.training.steps import standard_step
from tests.system import ddp_worker as worker
from tests.system.test_distributed import free_port

HERE = Path(__file__).resolve().parents[1] / "system"


@pytest.fixture(scope="module")
def lora_ddp_run(tiny_llama_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp_lora")
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(HERE / "ddp_worker.py"),
           "--model-dir", str(tiny_llama_dir), "--out-dir", str(out), "--lora"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("loss_name", ["softmax_nll", "kl_distill"])
@pytest.mark.parametrize("step", ["standard", "cache"])
def test_two_processes_with_lora_match_one_process(lora_ddp_run, tiny_llama_dir, loss_name, step):
    model, tok = worker.build(str(tiny_llama_dir), lora=True)
    q, p = worker.batch(tok, worker.QUESTIONS, worker.PASSAGES)
    loss, masks = build_loss(worker.LOSSES[loss_name]), worker.global_masks()
    ref = standard_step(model, q, p, lambda qv, pv: loss(qv, pv, masks, model.similarity))
    ref_grads = worker.grads_of(model)
    assert ref_grads and all(".lora_" in n or "projection" in n for n in ref_grads)  # adapters (and projection) only
    figures = [json.loads((lora_ddp_run / f"rank{r}_{loss_name}_{step}.json").read_text()) for r in range(2)]
    assert sum(f["loss"] for f in figures) / 2 == pytest.approx(ref.loss.item(), abs=1e-5)
    for r in range(2):
        got = load_file(str(lora_ddp_run / f"rank{r}_{loss_name}_{step}.safetensors"))
        assert got.keys() == ref_grads.keys()
        for name, g in ref_grads.items():  # tolerance as tests/system/test_distributed.py
            assert (got[name] - g).abs().max().item() <= 1e-5 + 1e-5 * g.abs().max().item(), (r, name)
