"""Run a console-script entry point frozen (SIGSTOP) just before the Nth call of a named function, so a
fault test can SIGKILL it at exactly that point instead of racing a poll against files that come and go.

    python tests/stop_at_call.py dpr.encode:commit_shard 2 dpr.cli.encode:main model=... passages=...

The function is replaced in its module's namespace, so only callers that look it up there (at call time)
are intercepted; the test waits for the stop with ``waitpid(WUNTRACED)``.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys


def _resolve(spec: str) -> tuple[object, str]:
    module, attr = spec.split(":")
    return importlib.import_module(module), attr


def main() -> None:
    target, nth, entry, *args = sys.argv[1:]
    module, attr = _resolve(target)
    original = getattr(module, attr)
    calls = 0

    def stop_before(*a, **k):
        nonlocal calls
        calls += 1
        if calls == int(nth):
            os.kill(os.getpid(), signal.SIGSTOP)
        return original(*a, **k)

    setattr(module, attr, stop_before)
    entry_module, entry_attr = _resolve(entry)
    sys.argv = [entry_attr, *args]
    getattr(entry_module, entry_attr)()


if __name__ == "__main__":
    main()
