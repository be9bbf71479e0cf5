"""Data parallelism for the cross-encoder's and the reader's trainers under ``torchrun`` (the retriever's uses
DDP and its gathered negatives: `dpr.training`).

The global batch is the config's ``batch_size`` whatever the world size: each rank takes its contiguous share of
the step's questions (:func:`share`), weighs its mean loss by its share of what the global mean averages over
(:func:`global_weight`), and the gradients are summed over ranks before clipping (:func:`all_reduce_grads`), so
every rank holds the one-process gradient (up to float rounding) and steps alike. Rank 0 is the one writer.
Alone (no process group) every helper is the identity, so the one-process path is unchanged.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

import torch

from dpr import distributed as dist

T = TypeVar("T")


def share(items: Sequence[T], rank: int | None = None, world: int | None = None) -> list[T]:
    """This rank's contiguous share of ``items`` (sizes differ by at most one; the first ranks get the extra)."""
    rank = dist.rank() if rank is None else rank
    world = dist.world_size() if world is None else world
    n = len(items)
    return list(items[rank * n // world:(rank + 1) * n // world])


def check_batch(batch_size: int, key: str) -> None:
    """Every rank needs at least one question per step: refused in one line when ``batch_size`` < world size."""
    world = dist.world_size()
    if batch_size < world:
        raise ValueError(f"{key}={batch_size} questions per step is fewer than the {world} processes: every process "
                         "needs at least one (the batch is global: the same whatever the process count)")


def global_sum(value: float) -> float:
    """``value`` summed over ranks (the value itself when alone)."""
    if not dist.is_distributed():
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64,
                     device=dist.device() if torch.distributed.get_backend() == "nccl" else "cpu")
    torch.distributed.all_reduce(t)
    return float(t.item())


def global_weight(local: float) -> float:
    """This rank's part of a global mean: ``local / sum over ranks of local`` (1.0 when alone)."""
    if not dist.is_distributed():
        return 1.0
    total = global_sum(local)
    return float(local) / total if total > 0 else 0.0


def broadcast_parameters(model: torch.nn.Module) -> None:
    """Rank 0's weights on every rank (a fresh head is seeded alike on every rank; this makes it so on any device)."""
    if not dist.is_distributed():
        return
    with torch.no_grad():
        for p in model.state_dict().values():
            torch.distributed.broadcast(p, src=0)


def all_reduce_grads(model: torch.nn.Module) -> None:
    """Sum every trainable parameter's gradient over ranks, in one flat buffer (a missing gradient counts as 0)."""
    if not dist.is_distributed():
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    torch.distributed.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


__all__ = ["share", "check_batch", "global_sum", "global_weight", "broadcast_parameters", "all_reduce_grads"]
