"""The packages import one way only: fsm <- drafting <- assisted <- experiments, with no circles inside a package.

Every import counts, function-local ones included: an upward import hidden in a function is still a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("fsm", "drafting", "assisted", "experiments")  # each may import only those before it


def imports(path: Path) -> set[str]:
    """Dotted names of the project modules `path` imports (any depth in the file)."""
    package = path.parent.name
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package if node.level else (node.module or "")
            base = f"{base}.{node.module}" if node.level and node.module else base
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in LAYERS}


def modules() -> dict[str, set[str]]:
    """module name -> the project modules it imports (packages' __init__ and names that are not modules dropped)."""
    files = {f"{p.parent.name}.{p.stem}": p for layer in LAYERS for p in (ROOT / layer).glob("*.py")}
    return {name: {m for m in imports(path) if m in files and m != name} for name, path in files.items()}


def test_no_module_imports_a_layer_above_its_own():
    files = [p for layer in LAYERS for p in (ROOT / layer).glob("*.py")]
    upward = sorted({(f"{p.parent.name}.{p.stem}", target.split(".")[0]) for p in files for target in imports(p)
                     if LAYERS.index(target.split(".")[0]) > LAYERS.index(p.parent.name)})
    assert upward == []


def test_no_import_cycles_inside_a_package():
    graph = modules()
    cycles = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        for nxt in graph[node]:
            if nxt in path:
                cycles.add(tuple(sorted(path[path.index(nxt):])))
            elif nxt.split(".")[0] == node.split(".")[0] and len(path) < 12:
                visit(nxt, path + (nxt,))

    for start in graph:
        visit(start, (start,))
    assert sorted(cycles) == []


def test_every_name_imported_from_a_project_module_exists():
    """A name imported from a project module is defined there (a renamed constant breaks a script at once)."""
    import importlib

    missing = []
    for layer in LAYERS:
        for path in (ROOT / layer).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in LAYERS:
                    module = importlib.import_module(node.module)
                    missing += [f"{path.parent.name}/{path.name}: {node.module}.{a.name}" for a in node.names
                                if a.name != "*" and not hasattr(module, a.name)
                                and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert missing == []
