"""Shared plumbing for the thin Hydra entry points: where the configs live and how errors surface."""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from typing import Callable

from dpr.errors import DataError

from dpr.resources import CONF_DIR  # noqa: E402  conf/ of the source tree, or the copy a wheel ships

log = logging.getLogger("dpr")


def report_errors(command: str) -> Callable:
    """Turn expected failures (bad input, missing files) into one line on stderr and exit status 2.

    Hydra would otherwise print a traceback; users want the file, line and field.
    """

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (DataError, FileNotFoundError, FileExistsError, ValueError) as err:
                print(f"{command}: error: {err}", file=sys.stderr)
                sys.exit(2)

        return inner

    return wrap


def rename_overrides(argv: list[str], renames: dict[str, str]) -> list[str]:
    """``model=X`` → ``model_path=X`` for keys that collide with a config group of the same name.

    Hydra treats ``key=value`` as a config-group choice whenever ``conf/<key>/`` exists (as
    ``conf/model/`` and ``conf/index/`` do), so a plain path under that key cannot be passed as is.
    """
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        out.append(f"{renames[key]}={value}" if sep and key in renames else arg)
    return out
