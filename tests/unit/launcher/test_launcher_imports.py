"""The launcher runs alone inside training images, mounted as one file: it may import the
standard library and torch, and nothing else (not even the operator's own package)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parents[3] / "operator/torchrun_operator/launcher/launcher.py"
ALLOWED = set(sys.stdlib_module_names) | {"torch"}


def imported_roots(source: str) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            roots.add("." * node.level + (node.module or ""))  # relative: never allowed
    return roots


def test_launcher_imports_only_stdlib_and_torch() -> None:
    roots = imported_roots(LAUNCHER.read_text())
    assert "torch" in roots  # the check sees the lazy imports inside functions too
    assert roots <= ALLOWED, sorted(roots - ALLOWED)


def test_the_check_catches_a_third_party_import() -> None:
    assert imported_roots("def f():\n    import numpy\n") - ALLOWED == {"numpy"}
    assert imported_roots("from . import x\n") - ALLOWED == {"."}
