"""Uncertainty for retrieval figures: bootstrap confidence intervals, paired tests, and hit overlap.

Per-question values (0/1 hits for top-k accuracy, per-query scores for qrels metrics) are resampled
with one shared set of bootstrap draws for all systems, so the difference between two systems is a
*paired* bootstrap: every resample evaluates both on the same questions.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from dpr.eval.config import BootstrapConfig

# the defaults of dpr-eval's resamples and seed (one source: BootstrapConfig)
DEFAULT_RESAMPLES = BootstrapConfig().resamples
DEFAULT_SEED = BootstrapConfig().seed
# Bound the float64 intermediate of one chunk of resamples (chunk x questions x columns) to ~32 MB.
_MAX_CHUNK_ELEMS = 4_000_000


def bootstrap_means(
    values: np.ndarray, num_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> np.ndarray:
    """Means of ``values`` (``[N]`` or ``[N, M]``) over ``num_resamples`` resamples of the N rows.

    Returns ``[num_resamples, M]``. Seeded: the same input and seed give the same draws.
    """
    if int(num_resamples) < 1:
        raise ValueError(f"resamples must be >= 1 (bootstrap draws for the confidence intervals), got {num_resamples}")
    vals = np.asarray(values, dtype=np.float64)
    if vals.ndim == 0 or vals.shape[0] == 0:
        raise ValueError("no questions to resample: the results hold no questions")
    if vals.ndim == 1:
        vals = vals[:, None]
    n, m = vals.shape
    out = np.empty((num_resamples, m), dtype=np.float64)
    if n == 0:
        out.fill(np.nan)
        return out
    rng = np.random.default_rng(seed)
    chunk = max(1, min(num_resamples, _MAX_CHUNK_ELEMS // max(1, n * m)))
    for start in range(0, num_resamples, chunk):
        stop = min(num_resamples, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = vals[idx].mean(axis=1)
    return out


def confidence_interval(samples: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of bootstrap ``samples`` (``[B, M]``) per column."""
    alpha = (1.0 - level) / 2.0
    lo = np.quantile(samples, alpha, axis=0)
    hi = np.quantile(samples, 1.0 - alpha, axis=0)
    return lo, hi


def paired_bootstrap_pvalue(samples_a: np.ndarray, samples_b: np.ndarray, observed_delta: float) -> float:
    """Two-sided p-value for "A and B are equal" from paired bootstrap means.

    The resampled deltas are centred on the observed one (the null distribution, as in
    Berg-Kirkpatrick et al. 2012); p is the share of them at least as far from zero as observed.
    """
    deltas = np.asarray(samples_a) - np.asarray(samples_b)
    if len(deltas) == 0 or not np.isfinite(observed_delta):
        return float("nan")
    extreme = np.abs(deltas - observed_delta) >= abs(observed_delta) - 1e-12
    return float(extreme.mean())


def _log_binom_cdf_half(m: int, n: int) -> float:
    """log P(X <= m) for X ~ Binomial(n, 1/2), summed in log space (n can be large)."""
    log_terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2.0)
        for i in range(m + 1)
    ]
    top = max(log_terms)
    return top + math.log(sum(math.exp(t - top) for t in log_terms))


def sign_test_pvalue(values_a: Sequence[float], values_b: Sequence[float]) -> float:
    """Exact two-sided sign test on paired values; ties are dropped.

    For 0/1 hits this is the exact McNemar test: only questions that one system gets and the other
    misses carry evidence.
    """
    a = np.asarray(values_a, dtype=np.float64)
    b = np.asarray(values_b, dtype=np.float64)
    wins = int(np.sum(a > b))
    losses = int(np.sum(a < b))
    n = wins + losses
    if n == 0:
        return 1.0
    return float(min(1.0, 2.0 * math.exp(_log_binom_cdf_half(min(wins, losses), n))))


def overlap(hits_a: Sequence[bool], hits_b: Sequence[bool]) -> dict[str, int]:
    """How many questions both systems hit, only one of them, or neither."""
    a = np.asarray(hits_a, dtype=bool)
    b = np.asarray(hits_b, dtype=bool)
    return {
        "both": int(np.sum(a & b)),
        "only_a": int(np.sum(a & ~b)),
        "only_b": int(np.sum(~a & b)),
        "neither": int(np.sum(~a & ~b)),
    }
