"""The runtime's layout contract (see the `texstream.runtime` package docstring): the modules that
decide residency hold no GL and start no thread, and neither do the modules they import.

Imports are read from the source (every ``import`` statement, also under ``TYPE_CHECKING`` and inside
functions), followed through the package; a package's ``__init__`` is not followed, since it only
gathers names and adds no dependency of the importing module's own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import texstream

ROOT = Path(texstream.__file__).parent
DECIDERS = [
    "runtime.slots",
    "runtime.pool_sizing",
    "runtime.residency",
    "runtime.texture_sets",
    "runtime.records",
    "runtime.sharing",
    "runtime.budget_advice",
    "runtime.upload_budget",
    "runtime.upload_plan",
    "runtime.int_sets",
]
FORBIDDEN = ("moderngl", "threading", "concurrent", "ctypes", "texstream.gl", "texstream.native")


def module_file(name: str) -> Path | None:
    rel = name.removeprefix("texstream.").replace(".", "/")
    for candidate in (ROOT / f"{rel}.py", ROOT / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_of(name: str) -> set[str]:
    """Absolute names of everything module `name` imports."""
    path = module_file(name)
    assert path is not None, name
    package = name.rsplit(".", 1)[0] if path.name != "__init__.py" else name
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            for a in node.names:  # `from . import x` names a module
                if module_file(f"{mod}.{a.name}") is not None and mod.startswith("texstream"):
                    out.add(f"{mod}.{a.name}")
    return out


def closure(start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for dep in imports_of(name):
            path = module_file(dep) if dep.startswith("texstream") else None
            if path is not None and path.name != "__init__.py":
                todo.append(dep)
            elif not dep.startswith("texstream") or path is None:
                seen.add(dep)
    return seen


@pytest.mark.parametrize("module", DECIDERS)
def test_the_residency_core_imports_no_gl_and_no_threads(module: str) -> None:
    reached = closure(f"texstream.{module}")
    bad = sorted(m for m in reached if m.startswith(FORBIDDEN))
    assert not bad, f"texstream.{module} reaches {bad}"
    assert "texstream.runtime.residency" in closure("texstream.runtime.residency")


def test_the_check_sees_gl_where_there_is_some() -> None:
    """The walker itself: a mover is caught (else the test above could not fail)."""
    assert any(m.startswith("texstream.gl") for m in closure("texstream.runtime.pools"))
    assert "threading" in closure("texstream.runtime.io_workers")


def test_frame_stats_and_the_memory_report_do_not_import_the_streamer() -> None:
    for module in ("texstream.runtime.frame_stats", "texstream.telemetry.memory", "texstream.runtime.texture"):
        assert "texstream.runtime.streamer" not in closure(module), module


def test_the_facade_and_every_module_stay_small() -> None:
    """The streamer is the frame script (its parts live in their own modules): 450 lines at most; no
    engine module past 650 (split it by the nouns it owns)."""
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")}
    assert sizes["runtime/streamer.py"] <= 450, sizes["runtime/streamer.py"]
    big = {name: n for name, n in sizes.items() if n > 650}
    assert not big, big
