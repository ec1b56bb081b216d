"""The launcher runs alone inside training images, shipped as a zipapp of its package: each of
its modules may import the standard library, torch and its sibling modules (relatively, so the
package works under any name), and nothing else (not even the operator's own package)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "operator/torchrun_operator/launcher"
ALLOWED = set(sys.stdlib_module_names) | {"torch"}


def modules() -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted(PACKAGE.glob("*.py"))}


def imported_roots(source: str, siblings: set[str]) -> set[str]:
    """The roots a module imports; a relative import is allowed only one level up (this package)
    and only of a sibling module, and is named by a leading dot otherwise."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            names = [node.module] if node.module else [a.name for a in node.names]
            if node.level != 1 or not set(names) <= siblings:
                roots.add("." * node.level + (node.module or ""))
    return roots


def test_launcher_modules_import_only_stdlib_torch_and_each_other() -> None:
    sources = modules()
    siblings = set(sources)
    assert {"contract", "main", "shim", "agent"} <= siblings
    every: set[str] = set()
    for name, source in sources.items():
        roots = imported_roots(source, siblings)
        assert roots <= ALLOWED, (name, sorted(roots - ALLOWED))
        every |= roots
    assert "torch" in every  # the check sees the lazy imports inside functions too


def test_the_check_catches_a_third_party_or_foreign_import() -> None:
    siblings = {"contract"}
    assert imported_roots("def f():\n    import numpy\n", siblings) - ALLOWED == {"numpy"}
    assert imported_roots("from .. import api\n", siblings) - ALLOWED == {".."}
    assert imported_roots("from .nothere import x\n", siblings) - ALLOWED == {".nothere"}
    assert imported_roots("from torchrun_operator import api\n", siblings) - ALLOWED == {
        "torchrun_operator"
    }
    assert imported_roots("from . import contract\n", siblings) == set()
    assert imported_roots("from .contract import X\n", siblings) == set()
