"""Where texstream's shader files are: the ``texstream.shaders`` package data, named ``texstream/...``
in ``#include`` lines. Apart from `shaders` so that moderngl-window's finder (`window_finder`), which
`shaders.register_includes` loads, can find the files without importing the loader back.
"""

from __future__ import annotations

import importlib.resources
from importlib.resources.abc import Traversable
from pathlib import Path

from ..errors import ShaderError

__all__ = ["PACKAGE", "PACKAGE_PREFIX", "shader_root"]

PACKAGE = "texstream.shaders"
PACKAGE_PREFIX = "texstream/"  # include paths that name a shipped shader start with this


def shader_root() -> Traversable:
    """The folder of texstream's shader files (the ``texstream.shaders`` package data)."""
    try:
        return importlib.resources.files(PACKAGE)
    except ModuleNotFoundError:
        # An editable install does not expose a namespace package nested in a regular one; the
        # source checkout keeps the shaders next to the package folder.
        fallback = Path(__file__).resolve().parents[2] / "shaders"
        if fallback.is_dir():
            return fallback
        raise ShaderError(f"cannot find texstream's shader folder (package {PACKAGE} is not installed)") from None
