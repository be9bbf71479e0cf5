"""The gradient-cached forward/backward of a two-tower step (Gao et al., 2021); the plain step and the
chooser between the two are in :mod:`dpr.training.steps`.

The contrastive loss couples every question with every passage in the batch, so the batch can't
simply be split into micro-batches. The gradient cache decouples the loss from the encoders:

1. encode questions and passages chunk by chunk without autograd graphs (memory of one chunk);
2. compute the loss on the full set of representations (leaf tensors) and backpropagate to
   get d loss / d representation -- the "cache";
3. re-encode chunk by chunk *with* graphs and backpropagate ``rep.backward(cached_grad)``.

The parameter gradients equal those of one big forward/backward, as long as the re-encoding
reproduces the representations exactly. Dropout draws random masks, so the RNG state (CPU and
CUDA) is captured before each chunk's first pass and restored for its second pass (as
``torch.utils.checkpoint`` does), then the global RNG continues from where pass 1 left it.

Under DistributedDataParallel every chunk's backward would trigger a gradient all-reduce; all
but the last chunk therefore run inside ``model.no_sync()`` and the last one syncs the
accumulated gradients once. The last chunk encodes a question chunk *and* a passage chunk in one
``forward`` so that DDP sees every parameter used in the synchronising pass (no
``find_unused_parameters`` needed). To accumulate gradients over several steps, wrap the call in
``model.no_sync()`` yourself: the inner contexts keep sync off. DDP syncs buffers in each forward
(``broadcast_buffers=True``), so every rank must run the same number of chunks: keep per-rank
batch sizes equal (drop_last) or construct DDP with ``broadcast_buffers=False``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, ContextManager, Iterator, Mapping

import torch
from torch import nn

from dpr.losses import LossOutput
from dpr.models.length_buckets import length_order, restore_order, trim_padding
from dpr.trainkit.precision import AutocastCtx, autocast_scope

Inputs = Mapping[str, torch.Tensor]


def _no_sync(model: nn.Module) -> ContextManager:
    fn = getattr(model, "no_sync", None)
    return fn() if callable(fn) else contextlib.nullcontext()


def split_inputs(inputs: Inputs, chunk_size: int) -> list[dict[str, torch.Tensor]]:
    """Row chunks of a tokenizer batch, each cut to its own longest sequence.

    Columns where every row of the chunk is padding are dropped (left or right padding alike), so
    a chunk of short texts does not pay for the batch's longest one.
    """
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    if "input_ids" not in tensors:
        raise ValueError("inputs need an 'input_ids' tensor")
    n = tensors["input_ids"].shape[0]
    return [trim_padding({k: v[start : start + chunk_size] for k, v in tensors.items()})
            for start in range(0, n, chunk_size)]


@dataclasses.dataclass
class _RngState:
    """CPU and CUDA generator states, captured before a chunk's first pass."""

    cpu: torch.Tensor
    cuda_devices: list[int]
    cuda_states: list[torch.Tensor]

    @classmethod
    def capture(cls, cuda_devices: list[int]) -> "_RngState":
        return cls(torch.get_rng_state(), cuda_devices, [torch.cuda.get_rng_state(d) for d in cuda_devices])

    @contextlib.contextmanager
    def restored(self) -> Iterator[None]:
        """Run the block from this state; afterwards the generators are as they were before the block."""
        with torch.random.fork_rng(devices=self.cuda_devices, enabled=True):
            torch.set_rng_state(self.cpu)
            for dev, state in zip(self.cuda_devices, self.cuda_states):
                torch.cuda.set_rng_state(state, dev)
            yield


def _cuda_devices(*batches: Inputs) -> list[int]:
    devs = {v.device.index or 0 for b in batches for v in b.values() if isinstance(v, torch.Tensor) and v.is_cuda}
    if not devs and torch.cuda.is_available() and torch.cuda.is_initialized():
        devs = {torch.cuda.current_device()}
    return sorted(devs)


def grad_cache_step(
    model: nn.Module,
    q_inputs: Inputs,
    p_inputs: Inputs,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], LossOutput],
    chunk_size: int,
    autocast_ctx: AutocastCtx = None,
) -> LossOutput:
    """Same gradients as :func:`dpr.training.steps.standard_step`, with activation memory of ``chunk_size`` texts.

    ``model(q_inputs_or_None, p_inputs_or_None) -> (q, p)`` is a BiEncoder or a DDP wrapper of one.
    ``loss_fn(q, p)`` gets the full fp32 representations ``[B, D]`` and ``[N, D]``.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    # Rows go into chunks longest first, so each chunk pads to lengths close to its own (the loss sees
    # the batch's order again below); one chunk keeps the batch's order (and its dropout masks).
    q_order, p_order = _chunk_order(q_inputs, chunk_size), _chunk_order(p_inputs, chunk_size)
    q_chunks = split_inputs(_rows(q_inputs, q_order), chunk_size)
    p_chunks = split_inputs(_rows(p_inputs, p_order), chunk_size)
    if not q_chunks or not p_chunks:
        raise ValueError("grad_cache_step needs at least one question and one passage")
    # Each job is one forward; the last pairs the final question and passage chunks (see module doc).
    jobs: list[tuple[dict | None, dict | None]] = (
        [(c, None) for c in q_chunks[:-1]] + [(None, c) for c in p_chunks[:-1]] + [(q_chunks[-1], p_chunks[-1])]
    )
    cuda_devices = _cuda_devices(q_inputs, p_inputs)

    # Pass 1: representations without graphs, remembering the RNG state each forward started from.
    states: list[_RngState] = []
    q_reps: list[torch.Tensor] = []
    p_reps: list[torch.Tensor] = []
    with torch.no_grad():
        for q_chunk, p_chunk in jobs:
            states.append(_RngState.capture(cuda_devices))
            with autocast_scope(autocast_ctx):
                q, p = model(q_chunk, p_chunk)
            if q is not None:
                q_reps.append(q.float())
            if p is not None:
                p_reps.append(p.float())

    # The loss over the full batch, differentiated only down to the representations.
    q_all = torch.cat(q_reps).requires_grad_(True)  # chunk order; the loss gets the batch's order
    p_all = torch.cat(p_reps).requires_grad_(True)
    out = loss_fn(_unsort(q_all, q_order), _unsort(p_all, p_order))
    out.loss.backward()
    q_grads = list(q_all.grad.split([r.shape[0] for r in q_reps]))
    p_grads = list(p_all.grad.split([r.shape[0] for r in p_reps]))

    # Pass 2: re-encode each chunk with a graph from the same RNG state; push the cached gradient in.
    for k, ((q_chunk, p_chunk), state) in enumerate(zip(jobs, states)):
        last = k == len(jobs) - 1
        with contextlib.nullcontext() if last else _no_sync(model):
            with state.restored(), autocast_scope(autocast_ctx):
                q, p = model(q_chunk, p_chunk)
            tensors, grads = [], []
            if q is not None:
                tensors.append(q.float())
                grads.append(q_grads.pop(0))
            if p is not None:
                tensors.append(p.float())
                grads.append(p_grads.pop(0))
            torch.autograd.backward(tensors, grads)
    return dataclasses.replace(out, loss=out.loss.detach())


def _chunk_order(inputs: Inputs, chunk_size: int) -> torch.Tensor | None:
    """Rows longest first when there is more than one chunk and a mask to sort by, else None (as given)."""
    mask = inputs.get("attention_mask")
    if mask is None or inputs["input_ids"].shape[0] <= chunk_size:
        return None
    return length_order(mask).to(mask.device)


def _rows(inputs: Inputs, order: torch.Tensor | None) -> Inputs:
    if order is None:
        return inputs
    return {k: v[order] if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _unsort(reps: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """``reps`` in chunk order -> the batch's order (differentiable, so the cache's gradients come back sorted)."""
    return reps if order is None else restore_order(reps, order)
