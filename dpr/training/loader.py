"""The background loader: the next batches are built in a thread while the training thread runs the step.

A batch (`dpr.training.batching.TrainBatches.iter_epoch`: items, padded token ids, false-negative masks, teacher
scores) depends only on (seed, epoch, batch index), never on global RNG state or on the model, so building it
ahead in another thread yields the same batches in the same order (tests/training/test_loader.py); resume is
unchanged too: the trainer's position counts the batches it *consumed*, and a resumed run builds the batches from
there again (what was prefetched and never consumed is simply dropped). The thread spends its time in numpy,
the tokenizer's Rust code and torch, which release the GIL, and in the masks' Python, which does not: on a
2-core CPU the overlap is partial, on a GPU machine the step's host work no longer waits for data.

On CUDA the batch's tensors are pinned in the thread, so the step's ``.to(device, non_blocking=True)`` copies
overlap with compute.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator

import torch

_DONE = object()


def pin_batch(batch: Any) -> Any:
    """The batch with its input tensors in pinned memory (for non-blocking host-to-GPU copies)."""
    q = {k: v.pin_memory() for k, v in batch.q_inputs.items()}
    p = {k: v.pin_memory() for k, v in batch.p_inputs.items()} if batch.p_inputs is not None else None
    return batch._replace(q_inputs=q, p_inputs=p)


class Prefetcher:
    """Iterates ``source()`` in a daemon thread, up to ``depth`` items ahead; an exception there is raised here,
    at the item where it happened. :meth:`close` stops the thread (call it when leaving the loop early)."""

    def __init__(self, source: Callable[[], Iterator], depth: int = 2,
                 transform: Callable[[Any], Any] | None = None) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._source, self._transform = source, transform
        self._thread = threading.Thread(target=self._run, name="dpr-batch-loader", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._source():
                if self._transform is not None:
                    item = self._transform(item)
                if not self._put(item):
                    return
            self._put(_DONE)
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(err)

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self) -> Any:
        item = self._queue.get()
        if item is _DONE:
            self._queue.put(_DONE)  # stays exhausted
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10)


def batch_stream(batches: Any, epoch: int, start: int, passages: bool, *, background: bool, device: torch.device,
                 depth: int = 2) -> Iterator:
    """This rank's batches of ``epoch`` from ``start``: built in a :class:`Prefetcher` thread (``background``;
    pinned on CUDA) or inline. Close it (``.close()``) when leaving before the end."""
    if not background:
        return batches.iter_epoch(epoch, start=start, passages=passages)
    return Prefetcher(lambda: batches.iter_epoch(epoch, start=start, passages=passages), depth=depth,
                      transform=pin_batch if device.type == "cuda" else None)
