"""A folder named `texstream` (a clone) in the working folder: `make`'s install cannot be shadowed by
it, and where an editable install can be (setuptools' finder after Python's path finder, as a plain
`pip install -e .` leaves it), every entry point whose code runs says which folder shadows what."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"
EDITABLE = "__editable___texstream_"
# What a plain `pip install -e .` leaves: setuptools' finder for texstream after the path finder.
FINDER_LAST = (
    "import sys; ts = [m for m in sys.meta_path if getattr(m, '__module__', '').startswith("
    "'__editable___texstream_')]; [sys.meta_path.remove(m) or sys.meta_path.append(m) for m in ts]"
)


def _editable() -> bool:
    return any(getattr(m, "__module__", "").startswith(EDITABLE) for m in sys.meta_path)


needs_editable = pytest.mark.skipif(
    not _editable(), reason="texstream is not installed in editable mode here: no namespace folder can shadow it"
)


@pytest.fixture
def decoy(tmp_path: Path) -> Path:
    """A working folder holding a clone-like `texstream/` folder (no __init__.py)."""
    (tmp_path / "texstream" / "docs").mkdir(parents=True)
    (tmp_path / "texstream" / "README.md").write_text("a clone of the project\n")
    (tmp_path / "test_user.py").write_text("def test_user(gl_context):\n    pass\n")
    return tmp_path


def _python(folder: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )


def _message(folder: Path) -> str:
    return (
        f"the folder {(folder / 'texstream').resolve()} shadows the installed texstream package ({ENGINE}): "
        "a folder named texstream in the working folder or beside the script is imported in its place; "
        "run from another folder, or rename that one"
    )


@needs_editable
def test_python_m_texstream_names_the_shadowing_folder(decoy: Path) -> None:
    done = _python(
        decoy,
        f"{FINDER_LAST}; import runpy; sys.argv = ['texstream', '--version']; "
        "runpy.run_module('texstream', run_name='__main__', alter_sys=True)",
    )
    assert done.returncode == 1
    assert done.stderr == f"texstream: {_message(decoy)}\n"


@needs_editable
def test_the_command_line_module_names_the_shadowing_folder(decoy: Path) -> None:
    done = _python(decoy, f"{FINDER_LAST}; from texstream.apps.cli import main")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == f"ImportError: {_message(decoy)}"


@needs_editable
def test_the_pytest_plugin_names_the_shadowing_folder(decoy: Path) -> None:
    done = _python(
        decoy, f"{FINDER_LAST}; import pytest; sys.exit(pytest.main(['-q', '-rA', '-p', 'no:cacheprovider']))"
    )
    assert done.returncode == 1
    assert f"PytestConfigWarning: {_message(decoy)}" in done.stdout
    assert f"ERROR test_user.py::test_user - Failed: {_message(decoy)}"[:60] in done.stdout


@needs_editable
def test_the_makefile_install_cannot_be_shadowed(decoy: Path) -> None:
    """The line the Makefile writes into a .pth file, run first: `import texstream` is the real
    package, even with the finder order a plain editable install leaves."""
    (first,) = re.findall(r"^EDITABLE_FIRST := (.*)$", (ROOT / "Makefile").read_text(), re.M)
    done = _python(decoy, f"{FINDER_LAST}; {first}\nimport texstream as ts; print(ts.__file__, ts.Streamer.__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{ENGINE / '__init__.py'} Streamer\n"
    shadowed = _python(decoy, f"{FINDER_LAST}; import texstream as ts; print(ts.Streamer)")  # without it
    assert "module 'texstream' has no attribute 'Streamer'" in shadowed.stderr
