"""Measuring and extrapolating costs for `bench_scale.py`: peak memory, growth laws, projections."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

STATUS = Path("/proc/self/status")


def status_bytes(keys: Sequence[str] = ("VmRSS", "RssAnon", "RssFile")) -> dict[str, int]:
    """These fields of this process's /proc status (VmRSS: all resident memory; RssAnon: heap, numpy and faiss
    buffers; RssFile: pages of memory-mapped files), in bytes; 0 off Linux."""
    out = dict.fromkeys(keys, 0)
    try:
        for line in STATUS.read_text().splitlines():
            key = line.split(":", 1)[0]
            if key in out:
                out[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def rss_anon_bytes() -> int:
    """Anonymous resident memory of this process (heap, numpy and faiss buffers), from /proc.

    Anonymous rather than total RSS: memory-mapped shard files and the page cache would otherwise
    count as the build's memory although the kernel can drop them at any time. 0 off Linux.
    """
    return status_bytes(("RssAnon",))["RssAnon"]


class StatusPeaks:
    """``with StatusPeaks(keys) as p: ...`` → ``p.peak``: the highest value of each /proc status field in ``keys``
    (bytes) while the block ran, sampled on entry, every ``interval`` seconds by a thread, and on exit."""

    def __init__(self, keys: Sequence[str] = ("VmRSS", "RssAnon", "RssFile"), interval: float = 0.02) -> None:
        self.keys, self.interval, self.peak = tuple(keys), interval, dict.fromkeys(keys, 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _take(self) -> None:
        now = status_bytes(self.keys)
        self.peak = {k: max(self.peak[k], now[k]) for k in self.keys}

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._take()
            time.sleep(self.interval)

    def __enter__(self) -> "StatusPeaks":
        self._take()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._take()


class PeakRSS(StatusPeaks):
    """``with PeakRSS() as m: ...`` → ``m.peak_delta``: the highest anonymous RSS above the level at entry
    (numpy and faiss release the GIL while they work, so the sampling thread keeps running; a spike shorter than
    the interval can be missed)."""

    def __init__(self, interval: float = 0.02) -> None:
        super().__init__(("RssAnon",), interval)
        self.start = 0

    def __enter__(self) -> "PeakRSS":
        self.start = rss_anon_bytes()
        return super().__enter__()

    @property
    def peak_delta(self) -> int:
        return max(0, self.peak["RssAnon"] - self.start)


def growth_exponent(sizes: Sequence[float], values: Sequence[float]) -> float | None:
    """Least-squares slope of log(value) on log(size): cost ∝ size^exponent. None with fewer than two
    positive points (a cost too small to measure cannot be fitted)."""
    pts = [(math.log(s), math.log(v)) for s, v in zip(sizes, values) if s > 0 and v and v > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def project(sizes: Sequence[float], values: Sequence[float], target: float) -> dict:
    """``{"exponent", "at_target"}``: the fitted growth law, anchored at the largest measured size
    (the most representative point) and carried to ``target``."""
    b = growth_exponent(sizes, values)
    known = [(s, v) for s, v in zip(sizes, values) if v is not None]
    if b is None or not known:
        return {"exponent": None, "at_target": None}
    s0, v0 = max(known)
    return {"exponent": round(b, 3), "at_target": v0 * (target / s0) ** b}


def growth_table(sizes: Sequence[int], rows: Mapping[str, Sequence[float]], target: int) -> dict:
    """Growth law and projection of each named cost series (values aligned with ``sizes``)."""
    return {name: project(sizes, vals, target) for name, vals in rows.items()}
