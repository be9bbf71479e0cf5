"""Batches built off the training thread: the cross-encoder's and the reader's steps tokenize and collate their
next batches in a background thread while the current step runs (fast tokenizers release the GIL).

A step's batch is a pure function of the step (the trainers' groups, negatives and order are functions of
(seed, step)), so building it ahead changes nothing but when it is built: the batches, and so the losses and
weights, are identical with and without prefetching (tests/trainkit/test_prefetch.py). On CUDA the batch's tensors
are pinned in the worker, so the step's copies to the device can be non-blocking.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, TypeVar

import torch

T = TypeVar("T")


def pin(batch: Any) -> Any:
    """``batch`` with every CPU tensor in it (dicts, lists, tuples) in pinned memory."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory() if batch.device.type == "cpu" else batch
    if isinstance(batch, dict):
        return {k: pin(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(pin(v) for v in batch)
    return batch


def prefetched(build: Callable[[int], T], steps: Iterable[int], depth: int = 2, pin_memory: bool = False) -> Iterator[T]:
    """``build(step)`` for each of ``steps`` in order, up to ``depth`` of them built ahead in one background thread
    (``depth`` <= 0: built on the calling thread, when asked). An exception in ``build`` is raised where its step
    is consumed. ``pin_memory``: the built batches' tensors pinned (for non-blocking copies to a GPU)."""
    make = (lambda s: pin(build(s))) if pin_memory else build
    if depth <= 0:
        for step in steps:
            yield make(step)
        return
    todo = iter(steps)
    pending: deque[Future] = deque()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpr-batches") as pool:
        try:
            for step in todo:
                pending.append(pool.submit(make, step))
                if len(pending) > depth:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:  # a consumer that stops early (an error, a break) leaves no batch building behind it
            for f in pending:
                f.cancel()


__all__ = ["pin", "prefetched"]
