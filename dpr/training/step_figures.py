"""A step's figures (loss, in-batch accuracy and rank, masked pairs, gradient norm) brought from the device to the
host at a logging interval, without making the host wait for the work queued after them.

Reading a device tensor with ``float()`` or ``.cpu()`` waits for everything queued on its stream, including the
step just launched, so the next step is not queued while that one computes. :func:`stage` instead reduces the
figures on the device (one all-reduce for all of them under DDP), copies them to the host with
``non_blocking=True`` and records an event behind the copies: :meth:`Staged.wait` then waits for that event only,
which on CUDA is passed once the figures' own step is done, whatever was queued after them. On a CPU the copies
are plain copies and there is nothing to wait for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dpr import distributed as dist

ROW_FIELDS = ("loss", "accuracy", "avg_rank", "masked")  # metrics.jsonl's figures averaged over micro-batches and ranks


@dataclass
class Staged:
    """The figures of some steps on their way to the host: ``checks[i]`` = (step, lr, summed micro-batch losses
    averaged over ranks, this rank's mean loss, mean accuracy, gradient norm) for the divergence check and the
    health watch; ``rows[i]`` = (the row's arguments, its :data:`ROW_FIELDS` averaged over ranks, its gradient
    norm)."""

    checks: list[tuple] = field(default_factory=list)
    rows: list[tuple[tuple, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    event: Any = None

    def wait(self) -> Staged:
        """Block until the copies are on the host (on CUDA, until the staged steps are done, not the later ones)."""
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        return self


def _to_host(t: torch.Tensor) -> torch.Tensor:
    # CUDA -> CPU with non_blocking=True lands in pinned memory and returns at once: valid after the event
    return t.detach().to("cpu", non_blocking=t.device.type == "cuda", copy=True)


def stage(pending: list[tuple], rows: list[tuple]) -> Staged:
    """Start bringing ``pending`` steps' figures ((step, lr, grad norm, micro-batch losses, micro-batch accuracies),
    device tensors) and ``rows`` ((step, outputs, ...): a logged step's :class:`~dpr.losses.LossOutput` s; the step
    is one of ``pending``, whose gradient norm the row reports) to the host. The one collective runs here, in the
    same order on every rank."""
    staged = Staged()
    if not pending and not rows:
        return staged
    device = pending[-1][3].device if pending else rows[-1][1][0].loss.device
    # averaged over ranks in one all-reduce: each pending step's summed micro-batch losses, then each row's figures
    parts = [torch.stack([p[3].sum() for p in pending])] if pending else []
    parts += [torch.stack([torch.stack([torch.as_tensor(getattr(o, name), dtype=torch.float32).detach().to(device)
                                        for o in row[1]]).mean() for name in ROW_FIELDS]) for row in rows]
    reduced = _to_host(dist.all_reduce_mean(torch.cat(parts)))
    n = len(pending)
    if pending:
        local = _to_host(torch.stack([torch.stack([p[3].mean(), p[4].mean(), p[2].float().reshape(()).to(device)])
                                      for p in pending]))
        staged.checks = [(p[0], p[1], reduced[i], local[i, 0], local[i, 1], local[i, 2]) for i, p in enumerate(pending)]
    norms = {c[0]: c[5] for c in staged.checks}
    width = len(ROW_FIELDS)
    staged.rows = [(row, reduced[n + width * j:n + width * (j + 1)], norms[row[0]]) for j, row in enumerate(rows)]
    if device.type == "cuda":
        staged.event = torch.cuda.Event()
        staged.event.record()
    return staged
