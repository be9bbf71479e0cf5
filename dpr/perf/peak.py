"""The machine's practical matmul peak, measured: best GFLOP/s of a square matmul in a given dtype."""

from __future__ import annotations

import math
import time

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def matmul_peak_gflops(precision: str = "fp32", n: int = 2048, repeat: int = 5,
                       device: str | torch.device = "cpu") -> float:
    """Best GFLOP/s (``2n³`` per product) of ``repeat`` timed ``n × n`` matmuls after one warm-up.

    The best, not the mean: on a shared machine other jobs only ever slow a round down, so the fastest
    round is the closest to what the hardware can do.
    """
    if precision not in DTYPES:
        raise ValueError(f"precision must be one of {tuple(DTYPES)}, got {precision!r}")
    if n < 1 or repeat < 1:
        raise ValueError(f"n and repeat must be >= 1, got {n}, {repeat}")
    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(dev, DTYPES[precision])
    b = torch.randn(n, n, generator=gen).to(dev, DTYPES[precision])
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.mm(a, b)
    sync()
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / max(best, 1e-9) / 1e9
