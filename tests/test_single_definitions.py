"""Helpers the whole repository shares are defined once: one PSNR, one MiB constant."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("engine", "tests", "demos", "docs")


def definitions(name: str, *, assignments: bool = True) -> list[str]:
    """Every function called `name` (at any depth), and every assignment to it unless told not to
    count them (a `functools.partial` of the one definition is not a second one)."""
    found = []
    for tree in TREES:
        for path in (ROOT / tree).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                elif (
                    assignments
                    and isinstance(node, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_psnr_is_defined_once() -> None:
    found = definitions("psnr", assignments=False)
    assert [d.split(":")[0] for d in found] == ["engine/testing/images.py"], found


def test_mib_is_defined_once() -> None:
    assert [d.split(":")[0] for d in definitions("MIB")] == ["engine/units.py"], definitions("MIB")
