"""The one error type for bad input: it names the file, the line or record, and the field."""

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
