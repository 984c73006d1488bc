"""The package's modules import each other without a cycle: no module imports
one that imports it back, at module level or inside a function. Read from the
source (every import statement of every module), not from what Python
happened to import."""

from __future__ import annotations

import ast
from pathlib import Path

import polygate

PACKAGE = Path(polygate.__file__).resolve().parent


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its __init__)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["polygate", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that module ``name`` imports anywhere in its
    body: ``import a.b`` and ``from a import b`` name a.b when it is a
    module, else a; relative imports are resolved against the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph (its modules in order, the first repeated), or []."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(n: str) -> list[str]:
        state[n] = 1
        path.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return path[path.index(m) :] + [m]
            if m not in state and (found := visit(m)):
                return found
        path.pop()
        state[n] = 2
        return []

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return []


def test_the_package_imports_without_a_cycle() -> None:
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    assert graph["polygate._types"] >= {"polygate._outcome", "polygate._classify"}, "the walk finds imports (else it proves nothing)"
    assert "polygate.httpx" in graph["polygate.transport"], "imports inside the package are resolved"
    assert cycle(graph) == []


def test_the_walk_finds_a_cycle_hidden_inside_a_function(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from polygate.b import f\n")
    b.write_text("def f():\n    from . import a\n    return a\n")
    known = {"polygate.a", "polygate.b"}
    graph = {"polygate.a": imports("polygate.a", a, known), "polygate.b": imports("polygate.b", b, known)}
    assert cycle(graph) == ["polygate.a", "polygate.b", "polygate.a"]
