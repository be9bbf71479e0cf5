"""The README's links into docs/ resolve. `mkdocs build --strict` (.ci/run) checks every link inside docs/, but the
README and ARCHITECTURE.md are not MkDocs pages: this checks theirs, file and anchor, the way MkDocs names anchors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

toc = pytest.importorskip("markdown.extensions.toc")  # comes with mkdocs (the dev extra)

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def heading_anchors(md: Path) -> set[str]:
    """The ids MkDocs' toc gives the headings of ``md`` (code spans count by their text; fenced code is skipped)."""
    anchors, fence = set(), False
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^#{1,6} (.*?)\s*#*\s*$", line)):
            text = re.sub(r"`([^`]*)`", r"\1", m.group(1))
            anchors.add(toc.slugify(re.sub(r"<[^>]+>", "", text), "-"))
    return anchors


def broken_links(md: Path) -> list[str]:
    """Relative links of ``md`` whose file or ``#anchor`` does not exist, as ``'target (why)'``."""
    broken = []
    text = re.sub(r"^```.*?^```$", "", md.read_text(encoding="utf-8"), flags=re.S | re.M)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest):
            broken.append(f"{target} (no heading #{anchor})")
    return broken


@pytest.mark.parametrize("name", ["README.md", "ARCHITECTURE.md"])
def test_top_level_docs_links_resolve(name):
    md = REPO / name
    if not md.is_file():
        pytest.skip(f"{name} is not in this tree")
    assert broken_links(md) == []


def test_readme_links_into_every_docs_page():
    """The README is the door: each page of docs/ is reachable from it (directly or from docs/index.md)."""
    linked = {(REPO / t.partition("#")[0]).resolve() for t in LINK.findall((REPO / "README.md").read_text())
              if not re.match(r"^[a-z]+:", t)}
    pages = {p.resolve() for p in (REPO / "docs").rglob("*.md")}
    index_links = {(REPO / "docs" / t.partition("#")[0]).resolve()
                   for t in LINK.findall((REPO / "docs" / "index.md").read_text()) if not re.match(r"^[a-z]+:", t)}
    assert (REPO / "docs" / "index.md").resolve() in linked
    assert pages - linked - index_links <= {(REPO / "docs" / "results" / "teacher.md").resolve()}


def test_broken_file_and_anchor_are_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Multi-GPU and multi-node (`torchrun`)\n\n```\n# not a heading\n```\n")
    md = tmp_path / "README.md"
    md.write_text("[ok](docs/page.md) [ok](docs/page.md#multi-gpu-and-multi-node-torchrun) [web](https://x.org/y)\n"
                  "[gone](docs/nope.md) [bad](docs/page.md#not-a-heading)\n```\n[in code](docs/nope.md)\n```\n")
    assert broken_links(md) == ["docs/nope.md (no such file)", "docs/page.md#not-a-heading (no heading #not-a-heading)"]
