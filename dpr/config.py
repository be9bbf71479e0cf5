"""Config dataclasses from Hydra nodes or dicts: an unknown key (a typo) is an error, never silently ignored."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from dpr.errors import describe_range

T = TypeVar("T")


def strict_from_dict(cls: type[T], d: Mapping[str, Any], label: str) -> T:
    """``cls(**d)`` after checking every key of ``d`` is a field of the dataclass ``cls``."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown {label} config keys {unknown}; known: {sorted(known)}")
    return cls(**dict(d))


def check_known_keys(keys: Iterable[str], known: Sequence[str], owner: str) -> None:
    """A TypeError, in one line naming every key of ``keys`` that is not in ``known`` and the known ones, where
    any is not (as Python's for an unexpected keyword argument: the keys are a function's keyword settings)."""
    unknown = sorted(set(keys) - set(known))
    if unknown:
        raise TypeError(f"{owner} got unknown setting(s) {', '.join(map(repr, unknown))}; the known ones are "
                        f"{', '.join(known)}")


def with_overrides(base: T, overrides: Mapping[str, Any], owner: str, known: Sequence[str] | None = None) -> T:
    """The dataclass object ``base`` with ``overrides`` replaced: the one rule of the functions that take a settings
    object and keyword settings overriding it (a typo is refused, never ignored). ``known``: the keys allowed
    (default: every field of ``base``); ``owner`` names the function in the error (`check_known_keys`)."""
    names = list(known) if known is not None else [f.name for f in dataclasses.fields(base)]  # type: ignore[arg-type]
    check_known_keys(overrides, names, owner)
    return dataclasses.replace(base, **overrides)  # type: ignore[type-var]


def fields_from(cls: type[T], d: Mapping[str, Any]) -> T:
    """``cls`` from the keys of ``d`` that are fields of the dataclass ``cls``, its defaults for the others: a
    stage's config out of a command's root, which holds the command's own keys beside it."""
    return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


# ------------------------------------------------------------------ allowed ranges of numeric keys
# One Range for both checkers: `check_ranges` below (config dataclass objects: TrainConfig, RerankConfig, ...) and
# `dpr.cli.ranges.check_config_ranges` (the commands' composed configs, against their schemas' field metadata).
@dataclasses.dataclass(frozen=True)
class Range:
    """The allowed values of one numeric config key: a whole number (``integer``) or a finite real in
    ``[lo, hi]`` (``lo_open`` / ``hi_open``: the bound itself excluded; None: unbounded on that side).
    ``optional``: null is allowed too; ``count``: a list of ``(min, max)`` items (max None: any), each in
    the range. ``note`` says what the special values (zero, typically) mean. Booleans are never numbers
    here (``True`` is an int to Python, but ``batch_size=true`` is a mistake)."""

    lo: float | None = None
    hi: float | None = None
    integer: bool = False
    lo_open: bool = False
    hi_open: bool = False
    optional: bool = False
    count: tuple[int, int | None] | None = None
    note: str = ""

    def _number_ok(self, v: Any) -> bool:
        kind = numbers.Integral if self.integer else numbers.Real
        if isinstance(v, bool) or not isinstance(v, kind):
            return False
        try:  # an int too large for a float is no usable real either
            if not math.isfinite(float(v)):
                return False
        except OverflowError:
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)

    def allows(self, v: Any) -> bool:
        if v is None:
            return self.optional
        if self.count is None:
            return self._number_ok(v)
        if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Sequence):
            return False
        lo_n, hi_n = self.count
        return len(v) >= lo_n and (hi_n is None or len(v) <= hi_n) and all(self._number_ok(x) for x in v)

    def interval(self) -> str:
        """The bounds alone: ``[1, 100]``, ``(0, 1)``, ``>= 1``, ``<= 5``, or ``any finite number``."""
        return describe_range(self.lo, self.hi, self.lo_open, self.hi_open)

    def describe(self) -> str:
        """What a value must be, in words: ``an integer in [1, 100] or null (0: off)``."""
        what = "an integer" if self.integer else "a finite number"
        if self.lo is not None and self.hi is not None:
            what += f" in {self.interval()}"
        elif self.lo is not None or self.hi is not None:
            what += f" {self.interval()}"
        if self.count is not None:
            lo_n, hi_n = self.count
            n = f"{lo_n}" if hi_n == lo_n else f"{lo_n}+" if hi_n is None else f"{lo_n}-{hi_n}"
            what = f"a list of {n} items, each {what}"
        if self.optional:
            what += " or null"
        return what + (f" ({self.note})" if self.note else "")


def ranged(default: Any, lo: float | None = None, hi: float | None = None, note: str = "", *,
           recorded_before: Any = dataclasses.MISSING, recorded_as: str | None = None) -> Any:
    """A dataclass field with an allowed range in its metadata (``range``), read by
    `dpr.cli.ranges.check_config_ranges` on a composed config; null passes (the field's type says whether null is
    allowed at all). Here, below every floor, so a command's own config dataclass can carry its ranges.
    ``recorded_before`` / ``recorded_as``: as `setting`'s."""
    meta = {"range": Range(lo, hi, optional=True, note=note),
            **_later_meta(recorded_before, recorded_as, saved_always=False)}
    return dataclasses.field(default=default, metadata=meta)


def ranged_list(lo: float | None = None, hi: float | None = None, default: Callable[[], list] = list) -> Any:
    """A list field whose every element has the range."""
    return dataclasses.field(default_factory=default, metadata={"range": Range(lo, hi, optional=True), "each": True})


def Int(lo: int | None = None, hi: int | None = None, **kw: Any) -> Range:  # noqa: N802 - reads as a type
    return Range(lo, hi, integer=True, **kw)


def Real(lo: float | None = None, hi: float | None = None, **kw: Any) -> Range:  # noqa: N802
    return Range(lo, hi, **kw)


def setting(default: Any = dataclasses.MISSING, rule: Range | None = None, *,
            factory: Callable[[], Any] | None = None, recorded_before: Any = dataclasses.MISSING,
            recorded_as: str | None = None, saved_always: bool = False) -> Any:
    """A config dataclass field declared once: its default (or ``factory``) and its allowed values (``rule``), which
    `check_fields` reads from the field itself, so no second table of ranges can fall out of step with the
    fields. The field's comment is its doc.

    ``recorded_before``: for a key added after runs were recorded, the value those runs had without it. While the
    key holds that value it is left out of what runs record and compare (`recorded_later`), so a run, stage or
    shard recorded before the key existed stays up to date. ``recorded_as``: the key's name in that record where it
    differs from the field's. ``saved_always``: the saved config file writes the key even then; only the
    fingerprints and comparisons leave it out (`recorded_later`'s ``saved``)."""
    meta: dict[str, Any] = {"rule": rule} if rule is not None else {}
    meta.update(_later_meta(recorded_before, recorded_as, saved_always))
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _later_meta(recorded_before: Any, recorded_as: str | None, saved_always: bool) -> dict[str, Any]:
    if recorded_before is dataclasses.MISSING:
        if recorded_as is not None or saved_always:
            raise TypeError("recorded_as and saved_always describe a key with a recorded_before value")
        return {}
    return {"recorded_before": recorded_before, "recorded_as": recorded_as, "saved_always": saved_always}


def recorded_later(cls: Any, *, saved: bool = False) -> dict[str, Any]:
    """The keys of dataclass ``cls`` (a class or an instance) added after runs were recorded, each with the value
    those runs had (its field's ``recorded_before``), by the name the record uses (``recorded_as``, else the
    field's). ``saved``: only the keys that the saved config file too leaves out at that value (not
    ``saved_always``)."""
    return {f.metadata["recorded_as"] or f.name: f.metadata["recorded_before"] for f in dataclasses.fields(cls)
            if "recorded_before" in f.metadata and not (saved and f.metadata["saved_always"])}


def without_recorded_later(values: Mapping[str, Any], later: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` without the keys of ``later`` (`recorded_later`) that hold the value runs had before them: the
    form that runs and stages recorded before those keys existed compare equal to."""
    return {k: v for k, v in values.items() if not (k in later and v == later[k])}


def field_rules(cls: Any) -> dict[str, Range]:
    """The allowed values of every field of dataclass ``cls`` (a class or an instance) declared with `setting`."""
    return {f.name: f.metadata["rule"] for f in dataclasses.fields(cls) if "rule" in f.metadata}


def check_fields(obj: Any, label: str) -> None:
    """`check_ranges` of ``obj`` against the rules its fields declare (`setting`)."""
    check_ranges(obj, field_rules(obj), label)


def check_ranges(obj: Any, rules: Mapping[str, Range], label: str) -> None:
    """Raise ValueError (one line: ``<label>.<key> must be <range>, got <value>``) for the first field of the
    dataclass ``obj`` outside its rule; boolean fields (annotated ``bool``) must be booleans. Every numeric
    field needs a rule: a field without one is a programming error, caught by the tests."""
    for key, rule in rules.items():
        value = getattr(obj, key)
        if not rule.allows(value):
            raise ValueError(f"{label}.{key} must be {rule.describe()}, got {value!r}")
    for f in dataclasses.fields(obj):
        if f.type in ("bool", bool) and not isinstance(getattr(obj, f.name), bool):
            raise ValueError(f"{label}.{f.name} must be true or false, got {getattr(obj, f.name)!r}")


def numeric_fields(cls: type) -> list[str]:
    """The fields of dataclass ``cls`` annotated as numbers or lists of numbers (what needs a Range)."""
    num = ("int", "float", "int | None", "float | None", "List[int]", "List[float]", "list[int]", "list[float]")
    return [f.name for f in dataclasses.fields(cls) if f.type in num or f.type in (int, float)]


# ------------------------------------------------------------------ dataclass defaults as Hydra options
def register_defaults(group: str, name: str, cls: type, keys: Sequence[str] | None = None) -> None:
    """Store the defaults of dataclass ``cls`` in Hydra's ConfigStore as ``<group>/<name>``, for a YAML file
    to select (``- <group>@<package>: <name>``): the dataclass stays the one source of the values.
    ``keys``: only these fields (in this order), for a section that takes a part of the dataclass.

    Stored as a plain mapping, not as the dataclass: a typed node would type the package it lands in, so
    placed at the root (``@_global_``) or beside other keys of a section it would refuse every other key
    there. Types and ranges are checked afterwards by the command's schema (`dpr.cli.schemas`)."""
    from hydra.core.config_store import ConfigStore

    values = dataclasses.asdict(cls())
    if keys is not None:
        values = {k: values[k] for k in keys}  # a KeyError here: a key that is no field of cls
    ConfigStore.instance().store(group=group, name=name, node=values)
