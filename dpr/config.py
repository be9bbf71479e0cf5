"""Config dataclasses from Hydra nodes or dicts: an unknown key (a typo) is an error, never silently ignored."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


def strict_from_dict(cls: type[T], d: Mapping[str, Any], label: str) -> T:
    """``cls(**d)`` after checking every key of ``d`` is a field of the dataclass ``cls``."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown {label} config keys {unknown}; known: {sorted(known)}")
    return cls(**dict(d))
