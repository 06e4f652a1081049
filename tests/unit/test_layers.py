"""The package's layout holds (docs/architecture.md): the import graph read with ``ast`` from the
source, every ``import`` counted wherever it stands (a function-level import is still an edge),
has no circle; each package imports only its own modules and the layers below it; Invoke is
imported by ``cli/`` and ``api.py`` alone; the remote scripts import nothing of the package.

A failure names the modules of the circle in order, or the importing module, the line and what
it imported.
"""

import ast
import os
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "diagnostics"

# Lowest first. A package may import itself and anything before it; ``api`` (the public Python
# API) and the package's ``__init__`` stand on all of them.
LAYERS = ("core", "inventory", "transport", "views", "engine", "builtin", "runbooks", "cli", "api")
INVOKE_ALLOWED = ("cli", "api")
MAX_ROOT_MODULES = 8


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def client_modules() -> Dict[str, Path]:
    """Every module of the package that runs on this side (not ``scripts/``, the remote ones)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "scripts" not in path.relative_to(PACKAGE).parts:
            found[module_name(path)] = path
    return found


def imports_of(name: str, path: Path, known: Set[str]) -> List[Tuple[int, str]]:
    """(line, module) for every import in the file: ``from X import y`` is ``X.y`` where that is a
    module of the package, else ``X``; outside modules by their full name."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                found.append((node.lineno, candidate if candidate in known else source))
    return found


def graph() -> Dict[str, List[Tuple[int, str]]]:
    modules = client_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def own_edges(edges: Dict[str, List[Tuple[int, str]]]) -> Dict[str, Set[str]]:
    """Module → the package's modules it imports (an import of a package is of its __init__)."""
    return {name: {target for _, target in found if target in edges and target != name}
            for name, found in edges.items()}


def circles(adjacent: Dict[str, Set[str]]) -> List[List[str]]:
    """Every strongly connected component of more than one module (Tarjan), each as a path
    through it that comes back to its start."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(adjacent[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(path_through(sorted(component), adjacent))

    for v in sorted(adjacent):
        if v not in index:
            visit(v)
    return found


def path_through(component: List[str], adjacent: Dict[str, Set[str]]) -> List[str]:
    """A cycle from the component's first module back to it (breadth first inside it)."""
    inside = set(component)
    start = component[0]
    previous = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(adjacent[v] & inside):
            if w == start:
                path = [v]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                return list(reversed(path)) + [start]
            if w not in previous:
                previous[w] = v
                queue.append(w)
    return component


def layer_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


# ------------------------------------------------------------------------------------ the tests

def test_the_package_has_no_import_circle():
    found = circles(own_edges(graph()))
    assert not found, "import circles:\n" + "\n".join(" → ".join(c) for c in found)


def test_each_layer_imports_only_itself_and_the_layers_below_it():
    wrong = []
    for name, found in graph().items():
        layer = layer_of(name)
        if layer not in LAYERS:
            continue   # the package's __init__: its face only
        for line, target in found:
            other = layer_of(target) if target.startswith("diagnostics.") else None
            if other and other in LAYERS and LAYERS.index(other) > LAYERS.index(layer):
                wrong.append(f"{name}:{line} imports {target} ({layer} may not import {other})")
    assert not wrong, "\n".join(wrong)


def test_invoke_is_imported_by_the_cli_and_the_api_alone():
    wrong = [f"{name}:{line} imports {target}"
             for name, found in graph().items() if layer_of(name) not in INVOKE_ALLOWED
             for line, target in found if target.split(".")[0] == "invoke"]
    assert not wrong, "\n".join(wrong)


def test_every_module_is_in_a_layer_and_the_root_keeps_few():
    names = client_modules()
    root = [n for n in names if n.count(".") == 1 and not (PACKAGE / n.split(".")[1]).is_dir()]
    assert len(root) + 1 <= MAX_ROOT_MODULES, root          # + the package's __init__
    strays = [n for n in names if n.count(".") >= 1 and layer_of(n) not in LAYERS]
    assert not strays, f"modules in no layer of LAYERS: {strays}"


def test_the_remote_scripts_import_nothing_of_the_package():
    wrong = []
    for path in sorted((PACKAGE / "scripts").glob("*.py")):
        for line, target in imports_of("diagnostics.scripts." + path.stem, path, set()):
            if target.split(".")[0] == "diagnostics":
                wrong.append(f"{path.name}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------------------------ the reader itself, on purpose

def write(tmp_path, files):
    for rel, text in files.items():
        p = tmp_path / "diagnostics" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_a_function_level_import_is_an_edge_and_closes_a_circle(tmp_path, monkeypatch):
    write(tmp_path, {"__init__.py": "", "core/__init__.py": "",
                     "core/a.py": "from . import b\n",
                     "core/b.py": "def f():\n    from .a import x\n"})
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path / "diagnostics")
    assert circles(own_edges(graph())) == [["diagnostics.core.a", "diagnostics.core.b", "diagnostics.core.a"]]


def test_an_upward_import_and_invoke_outside_the_cli_are_named(tmp_path, monkeypatch):
    write(tmp_path, {"__init__.py": "", "core/__init__.py": "", "engine/__init__.py": "",
                     "core/x.py": "def f():\n    from ..engine import run\n",
                     "engine/run.py": "import invoke\n"})
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path / "diagnostics")
    with pytest.raises(AssertionError, match=r"diagnostics.core.x:2 imports diagnostics.engine.run"):
        test_each_layer_imports_only_itself_and_the_layers_below_it()
    with pytest.raises(AssertionError, match=r"diagnostics.engine.run:1 imports invoke"):
        test_invoke_is_imported_by_the_cli_and_the_api_alone()
