"""The one error type for bad input (it names the file, the line or record, and the field) and the one wording
of an allowed range in every message (`describe_range`: the argument checks and the config schemas)."""

from __future__ import annotations

from pathlib import Path


class DataError(ValueError):
    """Malformed input. ``str(err)`` is one line: ``<file>:<line>: field '<field>': <message>``."""

    def __init__(
        self,
        path: str | Path | None,
        message: str,
        *,
        line: int | str | None = None,
        field: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        self.message = message
        where = self.path or "<input>"
        if line is not None:
            where += f":{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{message}")


def describe_range(lo: float | None, hi: float | None, lo_open: bool = False, hi_open: bool = False) -> str:
    """``[1, 100]``, ``(0, 1)``, ``>= 1``, ``> 0``, ``<= 5`` or ``any finite number``; an int bound as written
    (1000000, not 1e+06), a float as %g (0.0001, 10000)."""
    def num(x: float) -> str:
        return f"{x:g}" if isinstance(x, float) else str(x)
    if lo is not None and hi is not None:
        return f"{'(' if lo_open else '['}{num(lo)}, {num(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {num(lo)}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {num(hi)}"
    return "any finite number"
