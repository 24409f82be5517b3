"""The models package imports in one direction: no module imports one that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

import proxy.models

PACKAGE = "proxy.models"


def imported_siblings(path: Path) -> set[str]:
    """The proxy.models modules a file imports, at run time or for annotations alike."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
            found.add(node.module.removeprefix(PACKAGE + "."))  # type: ignore[union-attr]
    return found


def test_the_models_package_has_no_import_cycle() -> None:
    folder = Path(proxy.models.__file__).parent
    graph = {path.stem: imported_siblings(path) & {p.stem for p in folder.glob("*.py")} for path in folder.glob("*.py")}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module not in done:
            for imported in graph[module]:
                visit(imported, (*path, module))
            done.add(module)

    for module in graph:
        visit(module, ())
