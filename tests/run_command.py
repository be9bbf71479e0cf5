"""Run a console script (``dpr-train``, ``dpr-encode`` ...) in this process, as its installed script would.

A subprocess costs each test ~5 s of ``import torch, transformers`` before the command reads its first argument;
the refusals, one-line errors, Hydra flags and output-kind checks are about what the command prints and returns,
not about the process. ``run_command(["dpr-encode", "model=m", ...])`` calls the script's entry point (the one
the installed distribution's metadata names, as ``pip install`` wires it) with ``sys.argv`` set, catches
``SystemExit``, captures stdout and stderr, and returns a ``subprocess.CompletedProcess`` (``returncode``,
``stdout``, ``stderr``): the tests' assertions read the same as against a real process.

Between calls it restores what a command may change in the process and a fresh process would not carry over:
Hydra's global state (``GlobalHydra``, ``HydraConfig``, the job runtime), logging (handlers, levels; the handlers a
command opened are closed), torch's grad mode, default dtype, thread count, matmul precision and RNG states, the
Python and NumPy RNGs, the environment, the working directory, ``sys.argv``, signal handlers and warning filters.
During the call, warnings and what is logged before the command configures logging reach its stderr, as in a new
process. An exception that escapes ``main`` is what Python prints for an uncaught one: a traceback, exit status 1.
What a process would print once at import (a library's import-time warning) is printed only by the first call that
imports it. Hydra's config store keeps the schemas of every command imported in this process, so Hydra's ``--help``
(which lists every config group in the store) lists other commands' groups too: ``--help`` tests start a process.

Where the process itself is the point (kill -9, locks, Ctrl-C, torchrun, a wheel's installed scripts, the
README's commands) tests start real processes instead.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import random
import signal
import subprocess
import sys
import traceback
import warnings
from functools import lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable, Mapping, Sequence

BIN = Path(sys.executable).parent
# What the tests' subprocesses ran with: no W&B, and no rank inherited from a launcher around pytest.
DEFAULT_ENV: dict[str, str | None] = {"WANDB_MODE": "disabled", "RANK": None}


@lru_cache(maxsize=None)
def _entry_point(name: str) -> Callable[[], object]:
    """The function the installed console script ``name`` calls (``dpr-encode`` → ``dpr.cli.encode:main``)."""
    found = [ep for ep in entry_points(group="console_scripts") if ep.name == name]
    if not found:
        raise LookupError(f"no console script named {name!r} is installed")
    module, _, attr = found[0].value.partition(":")
    target: object = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    return target  # type: ignore[return-value]


class _Capture(io.StringIO):
    """A text stream standing in for a pipe: not a terminal, no file descriptor (as ``capture_output``)."""

    def isatty(self) -> bool:
        return False


def _exit_status(code: object, stderr: io.TextIOBase) -> int:
    """What the interpreter makes of ``SystemExit(code)``: None → 0, an int as is, anything else printed, 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=stderr)
    return 1


@contextlib.contextmanager
def _logging_as_found():
    manager = logging.Logger.manager
    loggers = {name: lg for name, lg in manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    saved = {name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled) for name, lg in loggers.items()}
    root = logging.getLogger()
    root_saved = (root.level, list(root.handlers))
    disable = manager.disable
    # as in a new process: no handler on the root logger (pytest's capture handlers aside, so what the command
    # logs before it configures logging reaches stderr through logging's last resort), level WARNING
    root.handlers[:] = []
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        before = set(root_saved[1]).union(*(set(s[1]) for s in saved.values()))
        for lg in [root, *(x for x in manager.loggerDict.values() if isinstance(x, logging.Logger))]:
            for handler in lg.handlers:
                if handler not in before:
                    handler.close()  # a run directory's log file, a console handler on the captured stream
        for name, lg in manager.loggerDict.items():
            if not isinstance(lg, logging.Logger):
                continue
            lg.level, handlers, lg.propagate, lg.disabled = saved.get(name, (logging.NOTSET, [], True, False))
            lg.handlers[:] = handlers
        root.setLevel(root_saved[0])
        root.handlers[:] = root_saved[1]
        logging.disable(disable)


# The interpreter's own warning filters (``python -c "import warnings; print(warnings.filters)"``, no -W options).
PROCESS_WARNING_FILTERS = [("default", None, DeprecationWarning, "__main__", 0),
                           ("ignore", None, DeprecationWarning, None, 0),
                           ("ignore", None, PendingDeprecationWarning, None, 0),
                           ("ignore", None, ImportWarning, None, 0), ("ignore", None, ResourceWarning, None, 0)]


@contextlib.contextmanager
def _warnings_as_in_a_process():
    """A warning the command raises is printed on its stderr under the interpreter's default filters, as a process
    prints it (pytest records warnings instead, under the project's filters). Changing the filters also forgets
    which warnings were already shown, so one shown by an earlier test is shown again."""
    with warnings.catch_warnings():
        warnings.filters[:] = PROCESS_WARNING_FILTERS
        warnings._filters_mutated()  # type: ignore[attr-defined]
        warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
        warnings._showwarnmsg_impl = lambda msg: sys.stderr.write(  # type: ignore[attr-defined]
            warnings._formatwarnmsg(msg))  # type: ignore[attr-defined]
        yield


@contextlib.contextmanager
def _torch_as_found():
    import torch

    grad, dtype, threads = torch.is_grad_enabled(), torch.get_default_dtype(), torch.get_num_threads()
    matmul, rng = torch.get_float32_matmul_precision(), torch.get_rng_state()
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        yield
    finally:
        torch.set_grad_enabled(grad)
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(matmul)
        torch.set_rng_state(rng)
        torch.use_deterministic_algorithms(deterministic)


def _hydra_as_new() -> None:
    """Hydra keeps its last run in singletons: a second ``@hydra.main`` in one process refuses to start
    ("GlobalHydra is already initialized"), and ``HydraConfig.get()`` would answer with a finished run's cwd."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobRuntime

    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None
    Singleton._instances.pop(JobRuntime, None)


@contextlib.contextmanager
def _process_as_found(env: Mapping[str, str | None], cwd: str | os.PathLike | None):
    import numpy as np

    environ, here, argv = dict(os.environ), os.getcwd(), list(sys.argv)
    signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)}
    py_rng, np_rng = random.getstate(), np.random.get_state()
    try:
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if cwd is not None:
            os.chdir(cwd)
        with _warnings_as_in_a_process(), _logging_as_found(), _torch_as_found():
            yield
    finally:
        _hydra_as_new()
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
        sys.argv = argv
        for s, handler in signals.items():
            if handler is not None:
                signal.signal(s, handler)
        random.setstate(py_rng)
        np.random.set_state(np_rng)


def run_command(argv: Sequence[str | os.PathLike], *, cwd: str | os.PathLike | None = None,
                env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """Run console script ``argv[0]`` with arguments ``argv[1:]`` in-process; its exit status and output.

    ``env``: variables set for the call (None removes one), on top of :data:`DEFAULT_ENV` and this process's
    environment, as ``subprocess.run(env={**os.environ, ...})`` would. ``cwd``: where it runs."""
    name, *args = (str(a) for a in argv)
    return _run_main(_entry_point(name), [str(BIN / name), *args], cwd, env)


def run_script(path: str | os.PathLike, args: Sequence[str | os.PathLike] = (), *,
               cwd: str | os.PathLike | None = None,
               env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """``python <path> <args>`` in-process, as :func:`run_command` runs a console script: the file runs as
    ``__main__`` with its folder first on ``sys.path`` (as Python puts it), which is restored afterwards. What the
    script imports stays imported, and what it registers stays registered: the caller undoes that."""
    import runpy

    script = Path(cwd or ".", path).resolve()
    path_before = list(sys.path)
    sys.path.insert(0, str(script.parent))
    try:
        # the path as given (relative to cwd, where the call runs): runpy puts it in sys.argv[0], as Python does
        return _run_main(lambda: runpy.run_path(str(path), run_name="__main__"), [str(path), *map(str, args)],
                         cwd, env)
    finally:
        sys.path[:] = path_before


def _run_main(main: Callable[[], object], argv: list[str], cwd: str | os.PathLike | None,
              env: Mapping[str, str | None] | None) -> subprocess.CompletedProcess:
    out, err = _Capture(), _Capture()
    with _process_as_found({**DEFAULT_ENV, **(env or {})}, cwd):
        sys.argv = argv
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = _exit_status(exc.code, err)
            except KeyboardInterrupt:
                raise  # the user's Ctrl-C stops the test run, as it would a subprocess's parent
            except BaseException:  # noqa: BLE001 - what the interpreter prints for an uncaught exception
                traceback.print_exc(file=err)
                code = 1
    return subprocess.CompletedProcess([Path(argv[0]).name, *argv[1:]], code, out.getvalue(), err.getvalue())


def run_as_subprocess(cmd: Sequence[str | os.PathLike], *, cwd: str | os.PathLike | None = None,
                      env: Mapping[str, str] | None = None, check: bool = False,
                      **_process_options: object) -> subprocess.CompletedProcess:
    """:func:`run_command` called as ``subprocess.run`` is: ``cmd`` an installed script's path
    (``<venv>/bin/dpr-encode ...``) or ``[python, "-m", "dpr.cli.encode", ...]``; ``env`` the whole environment (a
    variable it lacks is unset for the call); ``check`` raises ``CalledProcessError``. The options of a process
    (``capture_output``, ``text``, ``timeout``) have no meaning here: output is always captured as text."""
    argv = [str(c) for c in cmd]
    if Path(argv[0]).name.startswith("python") and argv[1:2] == ["-m"]:  # python -m dpr.cli.<name>: dpr-<name>
        argv = ["dpr-" + argv[2].rsplit(".", 1)[1], *argv[3:]]
    else:
        argv[0] = Path(argv[0]).name
    whole = None if env is None else {**{k: None for k in os.environ if k not in env}, **env}
    proc = run_command(argv, cwd=cwd, env=whole)
    if check:
        proc.check_returncode()
    return proc


def refusal_line(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The one line a refused command printed (exit 2, no traceback), checked to hold each of ``words``."""
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("dpr-")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]
