"""Command lines as Hydra parses them: overrides first, then Hydra's own flags, in any order as typed.

Hydra reads ``sys.argv`` with argparse, where the overrides are one positional list (``nargs="*"``): the
overrides must come in one run, so ``dpr-train loss=hinge --cfg job train.lr=1e-5`` — or an override a
command appends itself (``dpr-train``'s ``hydra.output_subdir=...``) after a user's ``--cfg job`` — is
"unrecognized arguments". :func:`hydra_argv` rebuilds the command line as ``prog overrides... extra...
flags...``: every override (renamed where a key collides with a config group, see
:func:`dpr.cli.common.rename_overrides`), then the command's own overrides that the user did not give,
then Hydra's flags with their values (``--cfg job``, ``--info [what]``, ``-m``, ``--config-dir DIR``...).
Which flags take a value is read from Hydra's own parser, so a new Hydra flag is split correctly too.
"""

from __future__ import annotations

import functools
import re
from typing import Iterable, Mapping

from dpr.cli.common import rename_overrides

# Flags after which Hydra does not run the command (it prints and exits).
SHOW_ONLY = ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--version", "--shell-completion",
             "-sc")


@functools.lru_cache(maxsize=1)
def _flag_values() -> dict[str, tuple]:
    """Option string -> ``()`` (no value), ``None`` (one value) or the choices of an optional value."""
    from hydra._internal.utils import get_args_parser

    out: dict[str, tuple | None] = {}
    for action in get_args_parser()._actions:
        for opt in action.option_strings:
            if action.nargs == 0:
                out[opt] = ()
            elif action.nargs == "?":
                out[opt] = tuple(action.choices or ())
            else:
                out[opt] = None
    return out


def split_argv(args: Iterable[str]) -> tuple[list[str], list[str]]:
    """``(overrides, flags)`` of command-line arguments (without the program name); each flag keeps its value."""
    values = _flag_values()
    overrides, flags = [], []
    args = list(args)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-") or arg == "-":
            overrides.append(arg)
            continue
        flags.append(arg)
        name, eq, _ = arg.partition("=")
        kind = values.get(name, ())  # an unknown flag: passed on for Hydra to report
        if eq or kind == () or i >= len(args):
            continue
        if kind is None or args[i] in kind:  # the value of --cfg / --config-dir ...; --info's optional one
            flags.append(args[i])
            i += 1
    return overrides, flags


def given_keys(overrides: Iterable[str]) -> set[str]:
    """The config keys that overrides set (``+key=v``, ``~key`` and ``key=v`` all name ``key``)."""
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides}


# The cross-encoder's ``rerank.model`` is a mapping ``{name, lora}`` (`dpr.rerank.config.RerankModelConfig`) that
# also takes a plain name: a name given to it on the command line goes to its ``name``, so ``rerank.model=X
# rerank.model.lora={r: 16}`` works in either order (Hydra would replace the mapping by the string, then refuse the
# nested key).
NAMED_MODEL_KEYS = ("rerank.model", "teacher_cfg.rerank.model")


def model_name_overrides(overrides: Iterable[str]) -> list[str]:
    """``rerank.model=X`` → ``rerank.model.name=X`` (see :data:`NAMED_MODEL_KEYS`); a mapping or null as given."""
    out = []
    for o in overrides:
        key, sep, value = o.partition("=")
        plain_name = sep and value.strip() and not value.lstrip().startswith("{") and value.strip() != "null"
        out.append(f"{key}.name={value}" if key in NAMED_MODEL_KEYS and plain_name else o)
    return out


# A LoRA setting typed as a key of its own (``model.lora.r=16``, ``rerank.model.lora.alpha=32``): ``model.lora`` is
# null unless a preset sets adapters, and Hydra refuses a key under null; forced (``++``) it creates the mapping, or
# sets the key in a preset's mapping, keeping the preset's other keys.
LORA_KEY = re.compile(r"^\+{0,2}((?:[\w]+\.)*model\.lora\.\w+)$")


def lora_key_overrides(overrides: Iterable[str]) -> list[str]:
    """``model.lora.<key>=v`` (at any depth: the cross-encoder's ``rerank.model.lora.<key>`` too) → forced."""
    out = []
    for o in overrides:
        key, sep, value = o.partition("=")
        match = LORA_KEY.match(key) if sep else None
        out.append(f"++{match.group(1)}={value}" if match else o)
    return out


def hydra_argv(argv: list[str], extra: Mapping[str, str] | None = None,
               renames: Mapping[str, str] | None = None) -> list[str]:
    """``argv`` reordered for Hydra: program, overrides (``renames`` applied, a cross-encoder's model name given
    to its ``name``: :func:`model_name_overrides`), those of ``extra`` whose key the user did not set, then
    Hydra's flags."""
    overrides, flags = split_argv(argv[1:])
    if renames:
        overrides = rename_overrides(overrides, dict(renames))
    overrides = lora_key_overrides(model_name_overrides(overrides))
    # threads=N is a process setting in no command's config (dpr.perf.threads pops it before the schema check)
    overrides = [f"++{o}" if o.partition("=")[0] == "threads" else o for o in overrides]
    given = given_keys(overrides)
    added = [f"{k}={v}" for k, v in (extra or {}).items() if k not in given]
    return [argv[0], *overrides, *added, *flags]


def shows_only(argv: list[str]) -> bool:
    """True when Hydra will only print something (``--cfg``, ``--info``, ``--help`` ...), not run the command."""
    _, flags = split_argv(argv[1:])
    return any(f.partition("=")[0] in SHOW_ONLY for f in flags)


def refuse_moved(argv: list[str], moved: Mapping[str, str]) -> None:
    """ValueError (one line) for an override of a key that moved: ``moved`` maps the old key to a hint naming
    where it went (Hydra alone would only call the old key unknown)."""
    overrides, _ = split_argv(argv[1:])
    for key in sorted(given_keys(overrides) & set(moved)):
        raise ValueError(f"config key {key}: unknown; {moved[key]}")
