"""Telling a user that a folder named ``texstream`` shadows the installed package.

A folder named ``texstream`` without an ``__init__.py`` (the default name of a clone of the project)
in the working folder, or beside the script Python runs, is a namespace package to Python's path
finder. Where texstream is installed in editable mode, setuptools' finder for it comes after the
path finder, so ``import texstream`` yields that empty namespace: ``module 'texstream' has no
attribute 'Streamer'``, and none of texstream's own code runs. Its submodules still resolve through
the editable finder, though, so the entry points that import a submodule first (``python -m
texstream``, the command line module, the pytest plugin) can check, and say which folder it is.

``make`` installs texstream so that the shadow cannot happen (see the Makefile); a regular
(non-editable) install cannot be shadowed either: a regular package anywhere on sys.path wins over
namespace folders.
"""

from __future__ import annotations

import sys
from pathlib import Path

INSTALLED = Path(__file__).resolve().parent  # this package's folder, where the real texstream is


def shadowing_folder() -> str | None:
    """The folder a namespace package ``texstream`` was imported from in place of this package, or
    None when ``texstream`` is this package (or not imported yet)."""
    module = sys.modules.get(__package__ or "texstream")
    if module is None or getattr(module, "__file__", None) is not None:
        return None
    folders = list(getattr(module, "__path__", []))
    return str(Path(folders[0]).resolve()) if folders else "an unknown folder"


def shadow_message(folder: str) -> str:
    return (
        f"the folder {folder} shadows the installed texstream package ({INSTALLED}): a folder named "
        "texstream in the working folder or beside the script is imported in its place; run from "
        "another folder, or rename that one"
    )


def check_not_shadowed() -> None:
    """Raise ImportError naming the shadowing folder, if there is one."""
    folder = shadowing_folder()
    if folder is not None:
        raise ImportError(shadow_message(folder))
