"""The allowed range of every numeric key of the command schemas (`dpr.cli.schemas`): ``ranged(default, lo, hi,
note)`` field metadata holding a `dpr.config.Range` (the one Range class, shared with the config dataclasses'
checker `dpr.config.check_ranges`), and `check_config_ranges`, the checker of a composed config. ``ranged`` and
``ranged_list`` live in `dpr.config` (the lowest floor, so a command's config dataclass such as
`dpr.reader.config.ReaderConfig` can carry its ranges too) and are re-exported here.

Types are checked first, by OmegaConf against the schema: here a value is already an int, a float or null, and
null (where the type is Optional) means the documented default ("auto"); 0 is never read as "auto".
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dpr.config import Range, ranged, ranged_list

__all__ = ["check_config_ranges", "range_rules", "ranged", "ranged_list"]


def _dataclass_of(tp: Any) -> type | None:
    for t in (tp, *typing.get_args(tp)):  # Optional[X] → X
        if dataclasses.is_dataclass(t):
            return t
    return None


def range_rules(schema: type, prefix: str = "") -> dict[str, tuple[Range, bool]]:
    """Every ranged key of ``schema`` (dotted, nested groups included) → (range, per element)."""
    rules: dict[str, tuple[Range, bool]] = {}
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if "range" in f.metadata:
            rules[prefix + f.name] = (f.metadata["range"], bool(f.metadata.get("each")))
        elif (sub := _dataclass_of(hints[f.name])) is not None:
            rules.update(range_rules(sub, f"{prefix}{f.name}."))
    return rules


def check_config_ranges(cfg: DictConfig, schema: type) -> None:
    """Raise ValueError (one line) naming the first key whose value lies outside its documented range."""
    for key, (rule, each) in range_rules(schema).items():
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        values = list(enumerate(value)) if each and value is not None else [(None, value)]
        for i, v in values:
            if not rule.allows(v):
                where = key if i is None else f"{key}[{i}]"
                allowed = rule.interval() + (f" ({rule.note})" if rule.note else "")
                raise ValueError(f"config key {where}: {v!r} is out of range; allowed: {allowed}")
