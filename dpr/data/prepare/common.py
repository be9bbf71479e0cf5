"""Pieces every recipe shares: seeded splits, answer de-duplication."""

from __future__ import annotations

import math
import random
from typing import Mapping, Sequence, TypeVar

from dpr.errors import DataError

T = TypeVar("T")


def check_fractions(split: Mapping[str, float], names: Sequence[str], where: str) -> dict[str, float]:
    """Validate split fractions (known names, each in [0, 1], summing to 1)."""
    if set(split) != set(names):
        raise DataError(where, f"expected split fractions for {list(names)}, got {sorted(split)}", field="split")
    fr = {k: float(split[k]) for k in names}
    if any(not 0.0 <= v <= 1.0 for v in fr.values()) or not math.isclose(sum(fr.values()), 1.0, abs_tol=1e-6):
        raise DataError(where, f"split fractions must lie in [0, 1] and sum to 1, got {fr}", field="split")
    return fr


def seeded_split(items: Sequence[T], fractions: Mapping[str, float], seed: int) -> dict[str, list[T]]:
    """Split ``items`` by seeded shuffle: the same on every machine.

    Items are sorted first (so file order does not matter), then shuffled with ``random.Random(seed)``,
    whose integer seeding and ``shuffle`` are stable across platforms and Python 3 versions. Sizes are
    ``round(n * fraction)`` for every split but the last, which takes the rest.
    """
    order = sorted(items)  # type: ignore[type-var]
    random.Random(seed).shuffle(order)
    names = list(fractions)
    out: dict[str, list[T]] = {}
    pos = 0
    for name in names[:-1]:
        k = min(round(len(order) * fractions[name]), len(order) - pos)
        out[name] = order[pos : pos + k]
        pos += k
    out[names[-1]] = order[pos:]
    return out


def dedup(strings: Sequence[str]) -> list[str]:
    """Strip and de-duplicate, keeping first-seen order and dropping empties."""
    seen: dict[str, None] = {}
    for s in strings:
        s = s.strip()
        if s:
            seen.setdefault(s, None)
    return list(seen)
