"""The command-line rules every script in scripts/ keeps, as the dpr commands do: a bad argument is one line naming
it, exit 2, before any work; an output path never replaces a directory or a file of another kind.

    from script_args import OneLineParser, whole, json_output
    ap = OneLineParser(description=...)
    ap.add_argument("--steps", type=whole(1), default=30)
    ap.add_argument("--json", type=json_output)

argparse checks each ``type`` as it parses, so a bad value never reaches the work; ``OneLineParser`` prints
``<script>: argument --steps: ... (--help for usage)`` instead of argparse's usage block and the error under it.
The standard library only (and yaml, for ``key_value``): scripts import this before torch.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Callable, NoReturn


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2): the usage is behind ``--help``, not printed above every error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (--help for usage)\n")


def whole(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number in ``[lo, hi]`` (None: unbounded)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected a whole number {_bounds(lo, hi)}, got {text!r}")
        return value
    parse.__name__ = "whole number"
    return parse


def real(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite real in ``[lo, hi]`` (``lo_open``: ``lo`` itself excluded)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or (lo is not None and (value <= lo if lo_open else value < lo)) or (
                hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected a finite number {_bounds(lo, hi, lo_open)}, got {text!r}")
        return value
    parse.__name__ = "number"
    return parse


def _bounds(lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo:g}"
    return f"<= {hi:g}" if hi is not None else ""


def comma_list(item: Callable[[str], Any] = str) -> Callable[[str], list]:
    """An argparse type: a comma list of at least one item, each parsed by ``item`` (e.g. ``whole(1)``)."""
    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"expected a comma list of at least one item, got {text!r}")
        return [item(p) for p in parts]
    parse.__name__ = "comma list"
    return parse


def key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` (the value read as YAML: ``false``, ``3``, ``[1, 2]``); the key a dotted name."""
    import yaml

    key, eq, value = text.partition("=")
    if not eq or not key.strip() or not all(part.isidentifier() for part in key.strip().split(".")):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. background_loader=false), got {text!r}")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError as err:
        raise argparse.ArgumentTypeError(f"{key}: value {value!r} is not YAML ({str(err).splitlines()[0]})") from None


def input_file(text: str) -> Path:
    """An argparse type: an existing regular file."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: {'is a directory, not a file' if path.is_dir() else 'no such file'}")
    return path


def input_dir(text: str) -> Path:
    """An argparse type: an existing directory."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {'is a file, not a directory' if path.exists() else 'no such directory'}")
    return path


def output_file(text: str) -> Path:
    """An argparse type: where a file can be written: not a directory or another non-file, its parent a directory
    (or not there yet: created when written)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a directory; give a file path for this output")
    if path.exists() and not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: exists and is not a regular file")
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(f"{text}: {parent} is a file, not a directory")
            break
    return path


def json_output(text: str) -> Path:
    """``output_file`` that replaces only an empty file or a JSON file (an earlier result): a user's file of
    another kind at that path (a CSV, a script) is refused, not overwritten."""
    path = output_file(text)
    if path.is_file() and path.stat().st_size:
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise argparse.ArgumentTypeError(
                f"{text}: exists and is not JSON; it is not replaced (give a new path for the JSON output)") from None
    return path


def output_of_kind(is_kind: Callable[[bytes], bool], what: str) -> Callable[[str], Path]:
    """An argparse type: ``output_file`` that replaces only an empty file or one ``is_kind`` recognises from its
    first 64 KiB (e.g. `dpr.output_kinds.dpr_results`); a user's file of another kind is refused."""
    def parse(text: str) -> Path:
        path = output_file(text)
        if path.is_file() and path.stat().st_size:
            with open(path, "rb") as f:
                head = f.read(1 << 16)
            if not is_kind(head):
                raise argparse.ArgumentTypeError(f"{text}: exists and is not {what}; it is not replaced "
                                                 "(give a new path)")
        return path
    parse.__name__ = what
    return parse


def owned_dir(marker: str, *earlier: str) -> Callable[[str], Path]:
    """An argparse type: a directory for a script's many outputs that may hold nothing of the user's: new, empty,
    or an earlier run's (it holds ``marker``, or one of ``earlier``: the files runs wrote before the marker).
    The script calls :func:`claim_dir` before it writes there."""
    def parse(text: str) -> Path:
        path = Path(text)
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: exists and is not a directory")
        if path.is_dir() and any(path.iterdir()) and not any((path / m).exists() for m in (marker, *earlier)):
            raise argparse.ArgumentTypeError(f"{text}: holds files this script did not write (no {marker}); "
                                             "give a new or empty directory")
        return path
    parse.__name__ = "output directory"
    return parse


def claim_dir(path: Path, marker: str, script: str) -> None:
    """Create ``path`` and mark it as ``script``'s (see :func:`owned_dir`)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / marker).write_text(f"written by scripts/{script}: a rerun may write here\n", encoding="utf-8")


def refuse(message: str) -> NoReturn:
    """Bad input found after parsing (a file's field, a device that is not there): one line on stderr, exit 2."""
    import sys

    print(message, file=sys.stderr)
    raise SystemExit(2)
