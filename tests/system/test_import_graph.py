"""The package's imports form no circle: every import counts, at module level, inside a function or under
TYPE_CHECKING, because a circle held apart by a lazy import is still two modules that cannot be read or changed
one without the other. (`lint-imports` in CI checks the floors: no import from a lower floor to a higher one.)"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dpr"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module → the package's modules it imports anywhere in its file (``from a import b`` names ``a.b`` when
    that is a module, else ``a``)."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = name.split(".") if is_pkg else name.split(".")[:-1]
                    parent = parent[: len(parent) - (node.level - 1)]
                    base = ".".join(parent + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                # a package's __init__ re-exporting its own modules is no circle of theirs
                if t and t != name and not (is_pkg and t.startswith(name + ".")):
                    graph[name].add(t)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_package_has_no_import_circle():
    assert circles(import_graph()) == []


def test_a_circle_through_a_lazy_import_is_found(tmp_path):
    pkg = tmp_path / "dpr"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from dpr.sub import a\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from dpr.sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dpr import d\n")
    (pkg / "d.py").write_text("import dpr.c\n")
    assert circles(import_graph(pkg)) == [["dpr.c", "dpr.d"], ["dpr.sub.a", "dpr.sub.b"]]
