"""train.optimizer_impl (`dpr.trainkit.optim`): plain, foreach and fused AdamW take the same steps in fp32,
and a resume may switch between them."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from dpr.training.config import TrainConfig
from dpr.trainkit.optim import build_optimizer, impl_flags, resolve_optimizer_impl


class Tiny(nn.Module):
    """Decayed weights, undecayed biases and a LayerNorm: both of param_groups' groups."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 16)
        self.LayerNorm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.LayerNorm(self.lin(x))))


def _train(impl: str, steps: int = 5) -> list[list[torch.Tensor]]:
    torch.manual_seed(0)
    model = Tiny()
    opt = build_optimizer(model, lr=1e-2, weight_decay=0.01, impl=impl)
    gen = torch.Generator().manual_seed(1)
    seen = []
    for _ in range(steps):
        x, y = torch.randn(6, 8, generator=gen), torch.randn(6, 4, generator=gen)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        seen.append([p.detach().clone() for p in model.parameters()])
    return seen


def test_fused_and_foreach_equal_plain_step_for_step(one_thread):
    plain = _train("plain")
    assert not torch.equal(plain[0][0], plain[-1][0])  # the weights moved: the comparison means something
    for impl in ("foreach", "fused", "auto"):
        for step, (want, got) in enumerate(zip(plain, _train(impl))):
            for w, g in zip(want, got):
                torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7, msg=lambda m: f"{impl} step {step}: {m}")


def test_impl_flags_and_auto():
    assert resolve_optimizer_impl("auto") == resolve_optimizer_impl(None) == "foreach"  # today's optimizer
    assert resolve_optimizer_impl("auto", "cpu") == "foreach"  # the CPU's figures stay what they were
    assert resolve_optimizer_impl("auto", "cuda:1") == resolve_optimizer_impl(None, torch.device("cuda")) == "fused"
    assert resolve_optimizer_impl("foreach", "cuda") == "foreach"  # an explicit choice is kept on every device
    assert impl_flags("plain") == {"foreach": False, "fused": False}
    assert impl_flags("fused") == {"foreach": False, "fused": True}
    opt = build_optimizer(Tiny(), lr=1e-3, impl="fused")
    assert all(g["fused"] and not g["foreach"] for g in opt.param_groups)
    with pytest.raises(ValueError, match="optimizer_impl must be one of"):
        resolve_optimizer_impl("apex")
    assert TrainConfig.from_dict({}).optimizer_impl == "auto"
    assert TrainConfig.from_dict({"optimizer_impl": "fused"}).optimizer_impl == "fused"
    with pytest.raises(ValueError, match="train.optimizer_impl must be one of"):
        TrainConfig.from_dict({"optimizer_impl": "apex"})


def test_resume_keeps_this_runs_impl(tmp_path):
    """load_state_dict restores the saved groups' flags; the checkpoint loader keeps this run's instead."""
    from dpr.trainkit import checkpoint as ckpt
    from dpr.trainkit.optim import linear_schedule
    from dpr.trainkit.seed import rng_state

    model = Tiny()
    saved = build_optimizer(model, lr=1e-3, impl="foreach")
    nn.functional.mse_loss(model(torch.randn(2, 8)), torch.randn(2, 4)).backward()
    saved.step()
    path = ckpt.save_checkpoint(tmp_path, 1, model, saved, linear_schedule(saved, 0, 10), None, {"step": 1},
                                [rng_state()])
    again = copy.deepcopy(model)
    opt = build_optimizer(again, lr=1e-3, impl="fused")
    ckpt.load_checkpoint(path, again, opt, linear_schedule(opt, 0, 10))
    assert all(g["fused"] and not g["foreach"] for g in opt.param_groups)
    assert opt.state_dict()["state"][0]["exp_avg"].abs().sum() > 0  # the moments came from the checkpoint
