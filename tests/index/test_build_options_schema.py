"""The ``index`` section is declared once (`dpr.index_config.BuildOptions`): the commands' schema has the same keys,
types, defaults and ranges, and `check_build_options` refuses exactly what those ranges refuse."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import pytest

from dpr.cli.schemas import IndexSchema, SCHEMAS
from dpr.index.build import BuildOptions, check_build_options
from dpr.index_config import RANGED_FIELDS, field_range


def _declared(cls: type) -> list[tuple]:
    hints = typing.get_type_hints(cls)
    return [(f.name, hints[f.name], f.default, f.metadata.get("range")) for f in dataclasses.fields(cls)]


def test_the_schema_is_the_dataclass():
    assert _declared(IndexSchema) == _declared(BuildOptions)
    assert typing.get_type_hints(SCHEMAS["index"])["index"] is IndexSchema


def test_every_numeric_setting_is_ranged():
    assert set(RANGED_FIELDS) == {"train_sample", "add_batch_size", "nlist", "m", "ef_construction", "ef_search",
                                  "nprobe", "seed"}


@pytest.mark.parametrize("name", RANGED_FIELDS)
def test_the_check_reads_each_declared_range(name):
    rng, nullable = field_range(name)
    check_build_options(BuildOptions(**{name: int(rng.lo)}))  # the floor itself passes
    check_build_options(BuildOptions(**{name: int(rng.hi)}))
    with pytest.raises(ValueError, match=f"index.{name} must be an integer"):
        check_build_options(BuildOptions(**{name: int(rng.lo) - 1}))
    with pytest.raises(ValueError, match=f"index.{name} must be an integer"):
        check_build_options(BuildOptions(**{name: int(rng.hi) + 1}))
    if nullable:
        check_build_options(BuildOptions(**{name: None}))
    else:
        with pytest.raises(TypeError, match=f"index.{name} must be an integer"):
            check_build_options(BuildOptions(**{name: None}))


def test_the_commands_schemas_read_the_declaration_without_importing_faiss():
    # every command checks its config first; faiss (and its load messages on stderr) is for the commands that index
    code = "import sys, dpr.cli.schemas; assert 'faiss' not in sys.modules, 'faiss imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
