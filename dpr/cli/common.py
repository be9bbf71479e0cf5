"""Shared plumbing for the thin Hydra entry points: where the configs live, how errors surface, and
how paths given on the command line are read (relative to where the user ran the command)."""

from __future__ import annotations

import contextlib
import datetime
import errno
import functools
import json
import logging
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from dpr.atomic import check_replaceable, create_error, nearest_existing
from dpr.output_kinds import foreign
from dpr.slurm import adopt_slurm_env
from dpr.errors import DataError

from dpr.resources import CONF_DIR  # noqa: E402  conf/ of the source tree, or the copy a wheel ships

log = logging.getLogger("dpr")

# Path-valued environment variables the configs read (``${oc.env:...}``): made absolute at start-up so
# that a relative value means "relative to where the command was run" in this process, in Hydra's run
# directory and in every subprocess (torchrun workers, tests' subprocesses in other directories).
PATH_ENV_VARS = ("DPR_DATA_MIRROR", "DPR_DATA_CACHE")
# Config keys (dotted) holding paths that are resolved the same way before the command runs.
PATH_KEYS = ("data_dir", "output_dir", "data.mirror_dir", "data.cache_dir", "passages", "output", "embeddings",
             "model_path", "index_path", "qa", "queries", "qrels", "bm25", "dense", "bm25_dev", "dense_dev",
             "qrels_dev", "index_dir")
# Config keys (dotted) naming a model to load, in any command: each is checked by `check_model_path` before the
# command runs, so a missing local directory is named as such (Hugging Face would call it a malformed repo id).
MODEL_KEYS = ("model_path", "model.name", "rerank.model", "rerank.model.name", "reader_cfg.model", "reader_model",
              "teacher_cfg.rerank.model", "teacher_cfg.rerank.model.name")  # rerank.model: a name or {name, lora}
# Config keys naming input files (a list for dpr-eval's ``results``): an empty value or a directory is refused before
# the command runs, naming the key (it would read the launch directory, or fail as a bare "[Errno 21] Is a
# directory" after the command had made its output directory).
FILE_INPUT_KEYS = ("passages", "qa", "queries", "qrels", "bm25", "dense", "bm25_dev", "dense_dev", "qrels_dev",
                   "index_path", "results")
DIR_INPUT_KEYS = ("embeddings", "data_dir")  # an empty value would read the launch directory
# how a model key is named in the message: the cross-encoder's model by its key, whichever spelling gave it
_MODEL_KEY_SHOWN = {"rerank.model.name": "rerank.model", "teacher_cfg.rerank.model.name": "teacher_cfg.rerank.model"}
# Expected failures: one line, exit 2. Anything else is a bug: one line + the traceback in a log file.
# OSError covers missing/unwritable paths, full disks and models that cannot be found or loaded.
# OmegaConf errors: a config problem (a missing mandatory value, an interpolation that cannot resolve).
# A corrupt/truncated .safetensors file (read) or a full disk under safetensors (write) is a SafetensorError:
# bad input or a full disk, not a bug.
def _safetensors_errors() -> tuple[type[BaseException], ...]:
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - safetensors comes with transformers
        return ()
    return (SafetensorError,)


SAFETENSORS_ERRORS = _safetensors_errors()
EXPECTED = (DataError, OSError, ValueError, OmegaConfBaseException, *SAFETENSORS_ERRORS)


def launch_dir() -> Path:
    """Where the user ran the command: Hydra's original cwd when Hydra changed into its run directory
    (``hydra.job.chdir=true``), else the current directory."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.cwd)
    except Exception:  # not under Hydra (plain Python use)
        return Path.cwd()


def user_path(path: str | os.PathLike, base: Path | None = None) -> Path:
    """``path`` made absolute against the launch directory (``~`` expanded); absolute paths as given."""
    p = Path(os.path.expanduser(str(path)))
    return p if p.is_absolute() else (base or launch_dir()) / p


def absolutize_env(names: tuple[str, ...] = PATH_ENV_VARS, base: Path | None = None) -> None:
    """Rewrite relative path variables of the environment as absolute paths (see PATH_ENV_VARS)."""
    for name in names:
        value = os.environ.get(name)
        if value and not Path(os.path.expanduser(value)).is_absolute():
            os.environ[name] = str(user_path(value, base))


def _looks_like_path(key: str, value: object) -> bool:
    # model_path may be a hub name ("sentence-transformers/all-MiniLM-L6-v2"): keep it unless it exists here
    if not isinstance(value, str) or not value or value.startswith(("http://", "https://")):
        return False
    if key == "model_path":
        return (launch_dir() / value).exists()
    return True


def absolutize_cfg(cfg: DictConfig, keys: tuple[str, ...] = PATH_KEYS) -> None:
    """Resolve the path keys of ``cfg`` present and set (relative → launch directory), in place."""
    base = launch_dir()
    with open_dict(cfg):
        for key in keys:
            try:
                value = OmegaConf.select(cfg, key, throw_on_missing=False)
            except Exception:  # an interpolation that cannot resolve: left for the command to report
                continue
            if _looks_like_path(key, value):
                OmegaConf.update(cfg, key, str(user_path(value, base)), merge=False)


def check_writable(path: str | os.PathLike, what: str = "output") -> Path:
    """Fail now, before any work, if ``path`` (a file or directory to be written) cannot be created:
    the nearest existing ancestor must be a writable directory. Creates nothing."""
    p = user_path(path)
    probe = nearest_existing(p)
    if not probe.is_dir():
        raise NotADirectoryError(f"{what} {p}: cannot be created, {probe} is not a directory")
    err = create_error(probe)
    if err is not None:
        raise PermissionError(f"{what} {p}: {probe} is not writable ({err.strerror})")
    return p


def check_output_dir(path: str | os.PathLike, what: str = "output_dir") -> Path:
    """`check_writable`, and ``path`` is a directory if it exists: a file or a symlink that cannot be followed
    (a loop, a missing target) there would otherwise fail later as a bare "[Errno 17] File exists"."""
    p = check_writable(path, what)
    if os.path.lexists(p) and not p.is_dir():
        if p.is_symlink():
            raise NotADirectoryError(f"{what} {p}: a symlink that does not lead to a directory (a loop or a "
                                     "missing target); give a directory")
        raise NotADirectoryError(f"{what} {p}: exists and is not a directory; give a directory")
    return p


def check_not_empty(key: str, value: object, what: str) -> None:
    """ValueError naming ``key`` when ``value`` is an empty (or blank) path: ``output_dir=`` would otherwise mean
    the launch directory itself."""
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"config key {key}: an empty path; give {what}")


def check_input_files(cfg: DictConfig) -> None:
    """Each input file key of :data:`FILE_INPUT_KEYS` that is set names a path, and not a directory (a missing
    file is left to the reader, whose message names it); ``embeddings=`` and ``data_dir=`` are not empty."""
    for key in DIR_INPUT_KEYS:
        with contextlib.suppress(OmegaConfBaseException):
            check_not_empty(key, OmegaConf.select(cfg, key, default=None, throw_on_missing=False), "a directory")
    for key in FILE_INPUT_KEYS:
        try:
            value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        except OmegaConfBaseException:  # an interpolation that cannot resolve: the command's to report
            continue
        values = list(value) if isinstance(value, (list, tuple, ListConfig)) else [value]
        for v in values:
            if not isinstance(v, str):
                continue
            check_not_empty(key, v, "a file")
            if user_path(v).is_dir():
                raise IsADirectoryError(f"config key {key}: {user_path(v)} is a directory; give a file")


def check_safetensors_file(path: Path) -> None:
    """DataError naming ``path`` if it is not a whole safetensors file (reads the header only): a truncated
    or corrupted file would otherwise fail deep inside the loader without naming itself."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise DataError(path, f"truncated or not a safetensors file ({size} bytes, no header)")
        n = int.from_bytes(head, "little")
        if n > size - 8:
            raise DataError(path, f"truncated or corrupt safetensors file: header of {n} bytes, file of {size}")
        try:
            header = json.loads(f.read(n))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise DataError(path, "corrupt safetensors file: unreadable header") from None
    need = 8 + n + max(ends, default=0)
    if need != size:
        raise DataError(path, f"truncated or corrupt safetensors file: its tensors need {need} bytes, "
                        f"the file holds {size}")


def check_model_files(model_dir: str | os.PathLike) -> None:
    """Every ``*.safetensors`` under a local model directory is whole (`check_safetensors_file`)."""
    root = user_path(model_dir)
    if root.is_dir():
        for path in sorted(root.rglob("*.safetensors")):
            check_safetensors_file(path)


def check_model_path(model_path: str) -> None:
    """A model given as a path must exist, and its safetensors files be whole. Hugging Face would call a
    missing ``runs/x/model`` a badly formed repo id; a hub name (``name`` or ``org/name``) is left to the loader."""
    value = str(model_path)
    if user_path(value).exists():
        check_model_files(value)
        return
    looks_local = value.startswith((".", "/", "~")) or value.count("/") > 1 or os.sep != "/" and os.sep in value
    if looks_local:
        raise FileNotFoundError(f"model not found: {value} (no such directory)")


def lock_run_dir_of_rank0(run_dir: str | os.PathLike, command: str) -> contextlib.AbstractContextManager:
    """`dpr.run_dir.lock_run_dir` in the process that owns the run directory (rank 0 under torchrun; the other
    ranks write nothing there), a no-op elsewhere."""
    if int(os.environ.get("RANK", "0")) != 0:
        return contextlib.nullcontext()
    from dpr.run_dir import lock_run_dir

    return lock_run_dir(run_dir, command)


def error_log_dir() -> Path:
    """Where tracebacks of unexpected errors go: ``$DPR_LOG_DIR`` or ``<tmp>/dpr-errors``."""
    return Path(os.environ.get("DPR_LOG_DIR") or Path(tempfile.gettempdir()) / "dpr-errors")


def write_error_log(command: str, err: BaseException) -> Path | None:
    """The full traceback of ``err`` in a fresh log file; None when even that cannot be written."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        d = error_log_dir()
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{command}-{stamp}-{os.getpid()}.log"
        path.write_text(f"{command} {' '.join(sys.argv[1:])}\n"
                        + "".join(traceback.format_exception(type(err), err, err.__traceback__)), encoding="utf-8")
        return path
    except OSError:
        return None


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _file_in_traceback(err: BaseException, suffix: str = ".safetensors") -> str | None:
    """The innermost file name ending in ``suffix`` held by a local of the frames ``err`` passed through
    (safetensors' errors do not name their file; its Python wrappers hold it as ``filename``)."""
    found, tb = None, err.__traceback__
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if isinstance(value, (str, os.PathLike)) and str(value).endswith(suffix):
                found = str(value)
        tb = tb.tb_next
    return found


def describe_expected(err: BaseException) -> str:
    """One line for an expected error; safetensors and disk-full errors get the file they were about."""
    text = _one_line(err)
    if SAFETENSORS_ERRORS and isinstance(err, SAFETENSORS_ERRORS):
        where = _file_in_traceback(err) or "a .safetensors file"
        if "serializ" in text and "deserializ" not in text:
            full = "StorageFull" in text or "code: 28" in text
            return f"cannot write {where}: {'disk full (No space left on device)' if full else text}"
        return f"{where}: corrupt or truncated safetensors file ({text})"
    if isinstance(err, OSError) and err.errno == errno.ENOSPC and not err.filename:
        return f"disk full: {text}"
    return text


def report_errors(command: str, outputs: tuple[str, ...] = (), schema: str | None = None,
                  file_outputs: tuple[str, ...] = (), file_kinds: tuple[str, ...] = ()) -> Callable:
    """Every failure as one line on stderr and a non-zero exit, never a traceback.

    Expected failures (bad input, missing files, bad values) → ``<command>: error: ...``, exit 2.
    Ctrl-C → ``<command>: interrupted``, exit 130. Anything else is a bug → one line naming the
    exception and a log file holding the traceback, exit 1. Before the command runs, relative paths
    in the environment and the config are made absolute against the launch directory, the config is
    type-checked against ``dpr.cli.schemas.SCHEMAS[schema]``, every model key (``MODEL_KEYS``) that names a
    local path is checked to exist (`check_model_path`), and the config keys named in
    ``outputs`` (directories the command writes in) are checked writable and not a file; those in
    ``file_outputs`` (where it writes one file) writable, not an existing directory, and not a file other than one
    of ``file_kinds`` (`dpr.output_kinds`; `dpr.atomic.check_replaceable`: nothing the user owns is replaced).
    """

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            try:
                absolutize_env()
                from dpr.perf.threads import configure_threads  # torch's threads: this process's share of the cores

                configure_threads(next((a for a in args if isinstance(a, DictConfig)), None))
                for a in args:
                    if isinstance(a, DictConfig):
                        if schema is not None:
                            from dpr.cli.schemas import SCHEMAS, check_config

                            check_config(a, SCHEMAS[schema])
                        absolutize_cfg(a)
                        for key in MODEL_KEYS:
                            try:
                                value = OmegaConf.select(a, key, default=None, throw_on_missing=False)
                            except OmegaConfBaseException:  # an interpolation that cannot resolve: the command's
                                continue
                            check_not_empty(_MODEL_KEY_SHOWN.get(key, key), value, "a model directory or name")
                            if isinstance(value, str) and value:
                                try:
                                    check_model_path(value)
                                except FileNotFoundError as err:
                                    raise FileNotFoundError(f"{_MODEL_KEY_SHOWN.get(key, key)}: {err}") from None
                        check_input_files(a)
                        for key in (*outputs, *file_outputs):
                            value = OmegaConf.select(a, key, default=None)
                            check_not_empty(key, value, "a file" if key in file_outputs else "a directory")
                            if isinstance(value, str) and value:
                                if key in file_outputs:
                                    check_writable(value, key)
                                    check_replaceable(user_path(value), directory=False,
                                                      same_kind=foreign(file_kinds) if file_kinds else None)
                                else:
                                    check_output_dir(value, key)
                return fn(*args, **kwargs)
            except EXPECTED as err:
                print(f"{command}: error: {describe_expected(err)}", file=sys.stderr)
                sys.exit(2)
            except KeyboardInterrupt:
                print(f"{command}: interrupted", file=sys.stderr)
                sys.exit(130)
            except RecursionError as err:
                print(f"{command}: error: input nested too deeply ({_one_line(err)})", file=sys.stderr)
                sys.exit(2)
            except Exception as err:  # noqa: BLE001 - the last line of defence: one line + a log file
                path = write_error_log(command, err)
                where = f"; traceback in {path}" if path else ""
                print(f"{command}: unexpected error: {type(err).__name__}: {_one_line(err)[:300]}{where}",
                      file=sys.stderr)
                sys.exit(1)

        return inner

    return wrap


def quiet_interrupt(command: str) -> Callable:
    """Decorate a console-script entry point so that what Hydra reports itself is one line too.

    Hydra prints composition errors (an unknown key without ``+``, a missing config group option, a
    value its own schema refuses) over several lines, and Ctrl-C during start-up as a traceback.
    With ``HYDRA_FULL_ERROR`` set, Hydra re-raises them instead; they become
    ``<command>: error: <message on one line>`` (exit 2) or ``<command>: interrupted`` (exit 130).
    Errors inside the command itself were already turned into one line by `report_errors`.
    """

    def wrap(main: Callable[[], None]) -> Callable[[], None]:
        @functools.wraps(main)
        def inner() -> None:
            os.environ["HYDRA_FULL_ERROR"] = "1"
            try:
                adopt_slurm_env()  # an srun task is a rank before anything reads RANK (dpr/slurm.py)
                main()
            except KeyboardInterrupt:
                print(f"{command}: interrupted", file=sys.stderr)
                sys.exit(130)
            except Exception as err:  # noqa: BLE001 - Hydra's start-up errors: the config is wrong
                cause = f" ({_one_line(err.__cause__)})" if err.__cause__ is not None else ""
                print(f"{command}: error: {_one_line(err)}{cause}"[:2000], file=sys.stderr)
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
