"""The project speaks to its users: no line of the README, the docs, the package, the configs, the scripts or the
tests cites when or in which round of work something was done (a numbered stop, issue or session). The history of a figure belongs in the version history, not in the pages a user reads."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HISTORY = re.compile(r"\b(stop|issue|session)s? [0-9]+|\bthis session\b|\bGPU lent\b", re.IGNORECASE)
ROOTS = ("README.md", "docs", "dpr", "conf", "scripts", "tests")
SUFFIXES = {".md", ".py", ".yaml", ".yml", ".sh", ".toml", ".txt"}


def history_lines(root: Path) -> list[str]:
    found = []
    for name in ROOTS:
        top = root / name
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.suffix in SUFFIXES)
        for path in files:
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if HISTORY.search(line):
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()[:120]}")
    return found


def test_no_line_cites_a_round_of_work():
    assert history_lines(REPO) == []


def test_the_check_finds_each_form(tmp_path):
    (tmp_path / "docs").mkdir()
    # the forms are put together here, so this file does not match itself
    stop, issue, session = "st" + "op 40", "iss" + "ue 26", "this ses" + "sion"
    (tmp_path / "docs" / "page.md").write_text(
        f"fine: a stop word list, an issue tracker\nthe default since {stop}\nas {issue} asked\nmeasured in {session}\n")
    (tmp_path / "README.md").write_text("ok\n")
    assert [line.split(":")[1] for line in history_lines(tmp_path)] == ["2", "3", "4"]
