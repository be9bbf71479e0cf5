"""The backbone seam: only dpr.models knows the run directory's layout or a concrete model class. A string constant
naming a tower folder or the model marker, or an isinstance check against BiEncoder, anywhere else fails this test
(docstrings and comments may still say what a run directory holds)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dpr"
LAYOUT = ("question_encoder", "passage_encoder", "biencoder.json", "projection.safetensors")


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [f"{path}:{node.lineno}: {name!r}" for name in LAYOUT if name in node.value]
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2
                and "BiEncoder" in ast.unparse(node.args[1])):
            found.append(f"{path}:{node.lineno}: isinstance(..., BiEncoder)")
    return found


def test_only_dpr_models_knows_the_run_directory_layout():
    offences = [o for path in sorted(PACKAGE.rglob("*.py")) if "models" not in path.relative_to(PACKAGE).parts[:1]
                for o in _offences(path)]
    assert offences == []


def test_dpr_models_holds_models_through_the_protocol():
    offences = [o for path in sorted((PACKAGE / "models").rglob("*.py")) for o in _offences(path)
                if "isinstance" in o]
    assert offences == []
