"""The mark an export directory carries (``dpr_export.json``: which run it was made from), so that exporting
again replaces only an export of the same run, never the user's directory or another model's export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

MARKER = "dpr_export.json"


def write_marker(export_dir: Path, source: str | Path, kind: str) -> None:
    body = {"exported_by": "dpr-export", "kind": kind, "source": str(Path(source).resolve())}
    (export_dir / MARKER).write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")


def owned_by(source: str | Path) -> Callable[[Path], bool | str]:
    """The ``owned=`` check of `dpr.atomic.atomic_path`: ``dir`` holds an export of ``source`` (another model's
    export: why it is not, for the refusal)."""
    want = str(Path(source).resolve())

    def owned(export_dir: Path) -> bool | str:
        try:
            body = json.loads((export_dir / MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        if isinstance(body, dict) and body.get("exported_by") == "dpr-export" and body.get("source") != want:
            return f"an export of another model ({body.get('source')}, as its {MARKER} says), not of {want}"
        return isinstance(body, dict) and body.get("exported_by") == "dpr-export" and body.get("source") == want

    return owned
