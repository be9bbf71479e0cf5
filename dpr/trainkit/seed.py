"""Seeding: the global RNGs from one seed, deterministic kernels, and the RNG states a checkpoint carries
(so a resumed run draws the dropout masks an uninterrupted one would have)."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's and torch's global RNGs (torch's seeds every CUDA device too)."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def use_deterministic_algorithms() -> None:
    """Deterministic kernels where torch has them (a warning where it has none), cuBLAS's workspace fixed
    and cuDNN's autotuner off: two runs on one machine give the same numbers."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def rng_state() -> dict:
    """This process's RNG states, in a form ``torch.load(weights_only=True)`` accepts."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": np_state[0],
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured (CUDA states only where there are GPUs)."""
    random.setstate(_as_tuple(state["python"]))
    npst = state["numpy"]
    np.random.set_state(
        (npst["kind"], npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"], npst["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:  # a different GPU count: restore this process's device only
            torch.cuda.set_rng_state(cuda[min(torch.cuda.current_device(), len(cuda) - 1)])


def _as_tuple(x: Any) -> Any:
    # random.setstate wants nested tuples; serialisation may hand back lists.
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


__all__ = ["seed_everything", "use_deterministic_algorithms", "rng_state", "set_rng_state"]
