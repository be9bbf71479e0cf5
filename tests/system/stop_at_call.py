"""Run a console-script entry point frozen (SIGSTOP) at a chosen call of a named function, so a fault
test can SIGKILL it at exactly that point instead of racing a poll against files that come and go.

    python tests/system/stop_at_call.py dpr.encode:commit_shard 2 dpr.cli.encode:main model=... passages=...
    python tests/system/stop_at_call.py dpr.atomic:replace_path "after-1@step_2'" dpr.cli.train:main ...

WHEN is ``[after-]N[@text]``: the Nth call (counting only calls whose arguments' repr contains ``text``),
frozen just before it runs or, with ``after-``, just after it returned. The function is replaced in its
module's namespace, so only callers that look it up there at call time are intercepted. The call it stops
at goes to stderr; the test waits for the stop with ``waitpid(WUNTRACED)``.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import sys


def _resolve(spec: str) -> tuple[object, str]:
    module, attr = spec.split(":")
    return importlib.import_module(module), attr


def _stop(message: str) -> None:
    print(f"stop_at_call: {message}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


def main() -> None:
    target, when, entry, *args = sys.argv[1:]
    m = re.fullmatch(r"(after-)?(\d+)(?:@(.*))?", when, re.S)
    if m is None:
        raise SystemExit(f"stop_at_call: WHEN must be [after-]N[@text], got {when!r}")
    after, nth, text = bool(m.group(1)), int(m.group(2)), m.group(3)
    module, attr = _resolve(target)
    original = getattr(module, attr)
    calls = 0

    def stopping(*a, **k):
        nonlocal calls
        hit = text is None or text in repr((a, k))
        calls += hit
        here = hit and calls == nth
        if here and not after:
            _stop(f"before call {calls} of {target}{a!r}")
        result = original(*a, **k)
        if here and after:
            _stop(f"after call {calls} of {target}{a!r}")
        return result

    setattr(module, attr, stopping)
    entry_module, entry_attr = _resolve(entry)
    sys.argv = [entry_attr, *args]
    getattr(entry_module, entry_attr)()


if __name__ == "__main__":
    main()
