"""Rank helpers and the gradient-carrying all-gather used by the contrastive loss.

Everything here degrades to the single-process answer when torch.distributed is not initialised,
so callers never branch on "am I distributed?" themselves.

Launch with ``torchrun --nproc_per_node=N ...``; :func:`init_distributed` reads torchrun's
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Under Slurm, ``srun`` alone is a
launcher too: :func:`dpr.slurm.adopt_slurm_env` writes torchrun's variables from the task's Slurm ones, so
every reader of RANK / WORLD_SIZE sees the same ranks. torchrun's variables win when both are set
(``srun torchrun ...``: one agent per node).
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from datetime import timedelta
from typing import Any, Sequence

import torch
import torch.distributed as dist

from dpr.slurm import adopt_slurm_env

log = logging.getLogger(__name__)


def init_distributed(backend: str | None = None, timeout_s: float = 1800.0) -> bool:
    """Join the process group torchrun (or an ``srun`` step, :func:`dpr.slurm.adopt_slurm_env`) describes;
    return True when running with more than one process.

    ``nccl`` when CUDA is available (and the CUDA device is set to LOCAL_RANK first, so every
    rank talks to its own GPU), ``gloo`` otherwise. Without torchrun's variables (or with
    WORLD_SIZE=1) nothing is initialised and False is returned. Safe to call twice.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() > 1
    adopt_slurm_env()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or "RANK" not in os.environ:
        return False
    if not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(cuda_index())
    backend = backend or ("nccl" if use_cuda else "gloo")
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    if backend == "gloo":
        atexit.register(cleanup)  # while the interpreter is whole: see cleanup
    log.info("distributed: rank %d/%d (local %d), backend %s", rank(), world_size(), local_rank(), backend)
    return world_size() > 1


def is_distributed() -> bool:
    """True inside an initialised process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def cuda_index() -> int:
    """The GPU this process uses: LOCAL_RANK, modulo the GPUs it sees (an ``srun --gpus-per-task=1`` task
    sees one GPU, ``cuda:0``, whatever its LOCAL_RANK)."""
    count = torch.cuda.device_count()
    return local_rank() % count if count else local_rank()


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main() -> bool:
    """Rank 0 (or the only process): the one that logs, saves and evaluates."""
    return rank() == 0


def device() -> torch.device:
    """The one device rule: ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU.

    Every stage that runs a model asks here (through :func:`resolve_device` where a command has a ``device``
    key): the dual encoder's training, validation, encode and retrieve, the cross-encoder's training,
    scoring, teacher scores and reranking, the reader's training and evaluation.
    """
    if torch.cuda.is_available():
        return torch.device("cuda", cuda_index())
    return torch.device("cpu")


AUTO_DEVICE = ("auto", "")


def available_devices() -> list[str]:
    """The devices this process can run a model on: ``cpu``, then ``cuda:0`` ... when CUDA is available."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return found


def check_device(name: str | torch.device | None, key: str = "device") -> str | None:
    """A ``device`` key's value, checked once: None for ``auto`` / null (the rule, :func:`device`), else the
    device as torch names it (``cuda`` is ``cuda:LOCAL_RANK``). A device this process cannot use (``cuda``
    on a CPU-only torch, ``tpu``, ``cuda:3`` with two GPUs) is one ValueError naming the devices available."""
    if name is None or str(name).strip().lower() in AUTO_DEVICE:
        return None
    text = str(name).strip().lower()
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        dev = None
    if dev is not None and dev.type == "cuda" and torch.cuda.is_available():
        index = cuda_index() if dev.index is None else dev.index
        if index < torch.cuda.device_count():
            return str(torch.device("cuda", index))
    if dev is not None and dev.type == "cpu":
        return "cpu"
    why = "not a device this process can use"
    if dev is not None and dev.type == "cuda":
        why = ("this torch is built without CUDA" if torch.version.cuda is None else
               "no GPU is visible to this process" if not torch.cuda.is_available() else
               f"this process sees {torch.cuda.device_count()} GPU(s)")
    raise ValueError(f"{key}={name}: {why}; available: auto (the rule: cuda:LOCAL_RANK when CUDA is present, "
                     f"else cpu), {', '.join(available_devices())}")


def resolve_device(name: str | torch.device | None = None, key: str = "device") -> torch.device:
    """The device a stage runs its model on: ``name`` checked (:func:`check_device`), ``auto`` / None the rule."""
    checked = check_device(name, key)
    return device() if checked is None else torch.device(checked)


def barrier() -> None:
    if not is_distributed():
        return
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` when not distributed."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def reduce_mean(value: float | torch.Tensor) -> float:
    """The mean of a scalar over ranks (for logging metrics such as the loss); ``value`` when alone."""
    t = value.detach().float().reshape(()) if isinstance(value, torch.Tensor) else torch.tensor(float(value))
    if not is_distributed():
        return float(t)
    t = t.to(device() if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t) / world_size()


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    """The element-wise mean of ``t`` over ranks, a tensor (``t`` itself when alone): one all-reduce for many
    figures, read by the caller when it needs them."""
    if not is_distributed():
        return t
    t = t.detach().float().to(device() if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t / world_size()


def all_gather_sizes(n: int, ref: torch.Tensor | None = None) -> list[int]:
    """The first-dimension size each rank contributes (one tiny collective)."""
    if not is_distributed():
        return [n]
    dev = ref.device if ref is not None else device()
    local = torch.tensor([n], dtype=torch.long, device=dev)
    sizes = [torch.zeros_like(local) for _ in range(world_size())]
    dist.all_gather(sizes, local)
    return [int(s.item()) for s in sizes]


class _AllGatherWithGrad(torch.autograd.Function):
    """Concatenate every rank's tensor along dim 0; the backward is the true adjoint.

    Forward: ``out = cat([t_0, ..., t_{W-1}])``. Rank s's loss L_s can depend on any slice of
    ``out``, so dL/dt_r = sum over s of (dL_s/d out)[slice r]. The backward therefore sums the
    incoming gradient over ranks (all_reduce) and returns this rank's slice. (The cheaper
    "local tensor with grad in its slot" trick used by DPR/Tevatron drops the other ranks' terms
    and must compensate by computing the loss over all gathered questions on every rank; the
    adjoint keeps each rank's loss local, see :func:`dpr.loss.contrastive_loss`.)
    Ranks may contribute different sizes (e.g. a short last batch): tensors are padded to the
    largest for the collective, then trimmed.
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:  # type: ignore[override]
        r = dist.get_rank()
        ctx.sizes = list(sizes)
        ctx.rank = r
        tensor = tensor.contiguous()
        longest = max(sizes)
        if tensor.shape[0] < longest:
            pad = tensor.new_zeros((longest - tensor.shape[0], *tensor.shape[1:]))
            send = torch.cat([tensor, pad])
        else:
            send = tensor
        bufs = [torch.empty_like(send) for _ in sizes]
        dist.all_gather(bufs, send)
        # Our own slot keeps the exact local values (bit-identical to the input).
        bufs[r] = send
        return torch.cat([b[:n] for b, n in zip(bufs, sizes)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        start = sum(ctx.sizes[: ctx.rank])
        return grad[start : start + ctx.sizes[ctx.rank]], None


def all_gather_with_grad(t: torch.Tensor, sizes: Sequence[int] | None = None) -> torch.Tensor:
    """All ranks' ``t`` concatenated along dim 0 (rank order), differentiable w.r.t. the local ``t``.

    The gradient reaching each rank's own slice is the sum, over all ranks, of the gradients of
    their losses with respect to that slice (the exact adjoint of the gather). ``sizes`` (each
    rank's ``t.shape[0]``, from :func:`all_gather_sizes`) saves one collective when already known.
    Not distributed: ``t`` itself.
    """
    if not is_distributed():
        return t
    if sizes is None:
        sizes = all_gather_sizes(t.shape[0], t)
    if sizes[rank()] != t.shape[0]:
        raise ValueError(f"sizes[{rank()}]={sizes[rank()]} but the local tensor has {t.shape[0]} rows")
    return _AllGatherWithGrad.apply(t, list(sizes))


def comm_device() -> torch.device:
    """Where a collective's tensors live: this rank's GPU under nccl, else the CPU (gloo's all-to-all takes CPU
    tensors only)."""
    if is_distributed() and dist.get_backend() == "nccl":
        return device()
    return torch.device("cpu")


def all_to_all_rows(chunks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Send ``chunks[r]`` to rank ``r``; return what every rank sent here, in rank order, on the CPU.

    Chunks may differ in rows (dim 0), not in dtype or trailing shape, on any rank. Two all-to-alls
    (``all_to_all_single``, which nccl and gloo both run with uneven splits): the row counts, then the rows.
    Not distributed: ``[chunks[0]]``.
    """
    if not is_distributed():
        return [chunks[0]]
    if len(chunks) != world_size():
        raise ValueError(f"{len(chunks)} chunks for {world_size()} ranks")
    dev = comm_device()
    send_counts = torch.tensor([c.shape[0] for c in chunks], dtype=torch.long, device=dev)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    send = torch.cat([c.to(dev) for c in chunks]).contiguous()
    recv = send.new_empty((int(recv_counts.sum()), *send.shape[1:]))
    dist.all_to_all_single(recv, send, recv_counts.tolist(), send_counts.tolist())
    return list(recv.cpu().split(recv_counts.tolist()))


# How long gloo's worker threads are given, after the group is left, to let go of finished collectives' tensors.
GLOO_SETTLE_S = 0.05


def cleanup() -> None:
    """Leave the process group (end of a run); a no-op outside one. :func:`init_distributed` registers it at exit
    under gloo, so every command leaves the group before the interpreter shuts down.

    Why gloo needs this: its worker threads drop a finished collective's tensors after the caller has already
    returned, and dropping a tensor Python also holds takes the GIL. A thread still waiting for the GIL when the
    interpreter finalises is ended mid-unwind and the process aborts (SIGABRT after a run that succeeded, so
    torchrun reports the job failed). A DistributedDataParallel model keeps the group alive past
    ``destroy_process_group``, so the threads are not joined there; sleeping releases the GIL and lets them
    finish first.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    gloo = dist.get_backend() == "gloo"
    dist.destroy_process_group()
    if gloo:
        time.sleep(GLOO_SETTLE_S)
