"""The packages import one way only: structspec_ops <- fsm <- drafting <- assisted <- experiments, with no circles
inside a package, and no module imports another module's private name (a helper two modules need lives where both can
import it).

Every import counts, function-local ones included: an upward import hidden in a function is still a cycle. Modules
in subpackages (`experiments/lib/`, ...) count as their package's.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("structspec_ops", "fsm", "drafting", "assisted", "experiments")  # each may import only those before it


def sources() -> list[Path]:
    """Every Python file of every layer, subpackages included (result folders hold no code)."""
    return sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py") if "results" not in p.parts)


def dotted(path: Path) -> str:
    """`experiments/lib/tasks.py` -> "experiments.lib.tasks" (a package's `__init__` is the package)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(path: Path) -> str:
    return path.relative_to(ROOT).parts[0]


def imports(path: Path) -> set[str]:
    """Dotted names of the project modules `path` imports (any depth in the file)."""
    package = dotted(path.parent / "__init__.py")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
            base = ".".join(part for part in (base, node.module or "") if part)
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in LAYERS}


def modules() -> dict[str, set[str]]:
    """module name -> the project modules it imports (packages' __init__ and names that are not modules dropped)."""
    files = {dotted(p): p for p in sources() if p.stem != "__init__"}
    return {name: {m for m in imports(path) if m in files and m != name} for name, path in files.items()}


def test_modules_in_subpackages_are_walked():
    """Modules below a layer's top level are held to the same rules: a subpackage is no way around them."""
    nested = {dotted(p) for p in sources() if len(p.relative_to(ROOT).parts) > 2 and p.stem != "__init__"}
    assert "experiments.lib.tasks" in nested and nested <= set(modules())
    assert "experiments.lib.intervals" in modules()["experiments.close_within_budget"]  # an absolute import, nested


def test_no_module_imports_a_layer_above_its_own():
    upward = sorted({(dotted(p), target.split(".")[0]) for p in sources() for target in imports(p)
                     if LAYERS.index(target.split(".")[0]) > LAYERS.index(layer(p))})
    assert upward == []


def test_no_module_imports_another_modules_private_name():
    private = sorted(f"{dotted(p)}: {node.module}.{a.name}" for p in sources()
                     for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ImportFrom)
                     and (node.module or "").split(".")[0] in LAYERS
                     for a in node.names if a.name.startswith("_") and not a.name.startswith("__"))
    assert private == []


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
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in LAYERS:
                module = importlib.import_module(node.module)
                missing += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                            if a.name != "*" and not hasattr(module, a.name)
                            and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert missing == []


LIBRARY = ("structspec_ops", "fsm", "drafting", "assisted")  # the installed packages (experiments/ is not one)


def test_every_module_name_means_one_thing_in_the_library():
    """No two library modules share a file name (a package's `__init__` aside): `closing`, `foreign` or `inputs` names
    one module, wherever it is read or imported from."""
    found: dict[str, set[str]] = {}
    for layer_name in LIBRARY:
        for path in (ROOT / layer_name).rglob("*.py"):
            if path.stem != "__init__":
                found.setdefault(path.stem, set()).add(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in found.items() if len(paths) > 1}
    assert shared == {}
