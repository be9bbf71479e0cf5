"""docs/reference.md is generated from the config dataclasses (scripts/config_reference.py): a setting added,
renamed, re-ranged or re-documented in code without the page rewritten fails here."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["config_reference"] = module
    spec.loader.exec_module(module)
    return module


def test_the_reference_page_is_what_the_code_declares(capsys):
    assert _script().main(["check"]) == 0, capsys.readouterr().err


def test_every_setting_of_every_section_has_a_row():
    ref = _script()
    page = (REPO / "docs" / "reference.md").read_text(encoding="utf-8")
    for prefix, spec, _ in ref.SECTIONS:
        cls = ref._load(spec)
        for f in dataclasses.fields(cls):
            if not dataclasses.is_dataclass(f.default_factory() if f.default_factory is not dataclasses.MISSING
                                             else f.default):
                assert f"| `{prefix}{f.name}` |" in page, (spec, f.name)


def test_a_fields_comment_becomes_its_doc():
    @dataclasses.dataclass
    class Demo:
        # --- a section heading is no field's doc
        size: int = 4        # how many
                             # and why
        # the block above a field without a comment of its own
        name: str = "x"
        flag: bool = False

    docs = _script().field_docs(Demo)
    assert docs == {"size": "how many and why", "name": "the block above a field without a comment of its own",
                    "flag": ""}
