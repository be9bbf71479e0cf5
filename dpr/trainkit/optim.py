"""AdamW with weight decay only where it belongs, DPR's linear warm-up/decay schedule (once, or once per phase),
clipping, and the update after a backward pass (clip, step, schedule) -- every trainer's."""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
from torch import nn

# AdamW's implementations: the same update computed per tensor (plain), over lists of tensors (foreach: a few
# multi-tensor kernels per step) or in one fused kernel per dtype and device (fused). The retriever's
# train.optimizer_impl (dpr.training.config) takes one of them.
OPTIMIZER_IMPLS = ("auto", "plain", "foreach", "fused")

# Biases and normalisation weights are not decayed (BERT/DPR practice): decaying a LayerNorm gain
# towards 0 shrinks activations instead of regularising.
_NO_DECAY = ("bias", "LayerNorm.weight", "layernorm.weight", "layer_norm.weight", "norm.weight")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: decayed weights, and biases/LayerNorm weights without decay.

    Parameters shared between towers appear once (``named_parameters`` de-duplicates them).
    """
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or name.endswith(_NO_DECAY) else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def resolve_optimizer_impl(impl: str | None, device: torch.device | str | None = None) -> str:
    """``plain``, ``foreach`` or ``fused`` for ``impl`` in :data:`OPTIMIZER_IMPLS`. ``auto``: ``fused`` for
    parameters on a CUDA device (one kernel per dtype and device instead of foreach's multi-tensor launches: less
    host cost per step where the host is what caps the GPU), ``foreach`` elsewhere (what every CPU run used before
    the setting existed, so the CPU's figures do not move)."""
    mode = str(impl or "auto").lower()
    if mode not in OPTIMIZER_IMPLS:
        raise ValueError(f"optimizer_impl must be one of {OPTIMIZER_IMPLS}, got {impl!r}")
    if mode != "auto":
        return mode
    return "fused" if device is not None and torch.device(device).type == "cuda" else "foreach"


def impl_flags(impl: str | None, device: torch.device | str | None = None) -> dict[str, bool]:
    """AdamW's ``foreach`` / ``fused`` keyword arguments for ``impl`` on ``device``."""
    mode = resolve_optimizer_impl(impl, device)
    return {"foreach": mode == "foreach", "fused": mode == "fused"}


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    impl: str | None = "auto",
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, computed by ``impl`` (:func:`resolve_optimizer_impl` on the device of the
    model's trainable parameters)."""
    trainable = next((q for q in model.parameters() if q.requires_grad), None)
    device = trainable.device if trainable is not None else None
    return torch.optim.AdamW(
        param_groups(model, weight_decay), lr=lr, betas=tuple(betas), eps=eps, **impl_flags(impl, device)
    )


def resolve_warmup(warmup_steps: int, warmup_ratio: float, total_steps: int) -> int:
    """Warm-up length: explicit steps win; otherwise a fraction of the total."""
    if warmup_steps and warmup_steps > 0:
        return int(warmup_steps)
    return int(math.ceil(max(0.0, warmup_ratio) * total_steps))


def linear_schedule(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up from 0 to the peak over ``warmup_steps``, then linear decay to 0 at ``total_steps``.

    This is DPR's (and BERT's) schedule; the scheduler is stepped once per optimizer step.
    """
    warmup_steps = max(0, int(warmup_steps))
    total_steps = max(1, int(total_steps))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return float(step + 1) / float(warmup_steps + 1)
        return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def phased_schedule(optimizer: torch.optim.Optimizer, phases: list[int], warmup_steps: int = 0,
                    warmup_ratio: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """DPR's warm-up/decay run once per phase: ``phases`` are consecutive step counts (e.g. the frozen-index
    phase, then the two-tower phase), each with its own warm-up (``warmup_steps``, else ``warmup_ratio`` of the
    phase) and linear decay to 0 -- a second phase must not inherit the first one's decayed tail."""
    phases = [int(n) for n in phases if int(n) > 0] or [1]
    bounds = [sum(phases[:i]) for i in range(len(phases) + 1)]
    warm = [resolve_warmup(warmup_steps, warmup_ratio, n) for n in phases]

    def factor(step: int) -> float:
        i = next((k for k in range(len(phases)) if step < bounds[k + 1]), len(phases) - 1)
        local, n, w = step - bounds[i], phases[i], warm[i]
        if local < w:
            return float(local + 1) / float(w + 1)
        return max(0.0, float(n - local) / float(max(1, n - w)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def clip_gradients(
    params: Iterable[torch.nn.Parameter],
    max_norm: float,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: "torch.amp.GradScaler | None" = None,
) -> torch.Tensor:
    """Clip the global gradient norm to ``max_norm`` (<= 0: measure only). Returns the norm before clipping, a
    0-dim tensor on the gradients' device (no host sync: ``float()`` it where a number is needed).

    With fp16 the gradients are still scaled: unscale them first, or the threshold means nothing.
    """
    params = [p for p in params if p.grad is not None]
    if not params:
        return torch.zeros(())
    if scaler is not None and scaler.is_enabled() and optimizer is not None:
        scaler.unscale_(optimizer)
    limit = max_norm if max_norm and max_norm > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, limit, foreach=True)
    return norm.detach()


def apply_update(params: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer, scheduler: Any,
                 max_grad_norm: float, scaler: "torch.amp.GradScaler | None" = None) -> tuple[float, torch.Tensor]:
    """The update after the backward passes: ``(lr, grad_norm)`` -- the learning rate this step uses, the
    gradient norm of ``params`` before clipping them to ``max_grad_norm`` (:func:`clip_gradients`); then the
    optimizer step (through ``scaler`` when given: it unscales, and skips the step on an fp16 overflow), the
    schedule step and the gradients cleared."""
    lr = scheduler.get_last_lr()[0]
    grad_norm = clip_gradients(params, max_grad_norm, optimizer, scaler)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return lr, grad_norm
