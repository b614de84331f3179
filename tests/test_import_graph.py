"""The package's import graph has no cycle: every import counts, including those under
``TYPE_CHECKING`` and those inside functions (a local import hides a circle, it does not cut it)."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "engine"
PACKAGE = "texstream"


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, from __init__.py)."""
    names: dict[str, Path] = {}
    for path in ENGINE.rglob("*.py"):
        parts = list(path.relative_to(ENGINE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join([PACKAGE, *parts])] = path
    return names


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules `name` imports, wherever in the file the import statement is."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == PACKAGE:
                target = node.module
            else:
                continue
            for alias in node.names:  # `from pkg import submodule` imports the submodule itself
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m in modules and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_imports_resolve_to_modules(tmp_path: Path) -> None:
    modules = module_names()
    bake = ENGINE / "bake" / "pipeline.py"
    got = imports_of("texstream.bake.pipeline", bake, modules)
    assert "texstream.bake.jobs" in got and "texstream.config" in got


def test_no_import_cycle_in_the_package() -> None:
    modules = module_names()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    found = cycles(graph)
    assert not found, "import cycles (counting TYPE_CHECKING and function-level imports):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )
