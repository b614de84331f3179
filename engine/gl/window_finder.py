"""moderngl-window's shader lookup learns ``texstream/...``: its ``load_program`` then resolves
``#include "texstream/vt.glsl"`` from texstream's shipped shaders, like `texstream.program` does.

moderngl-window resolves includes itself, through the finders named in ``settings.PROGRAM_FINDERS``
(not through ``ctx.includes``); `register_finder` adds `TexstreamShaderFinder` to that list.
Imported only where moderngl-window is.
"""

from __future__ import annotations

from pathlib import Path

from moderngl_window.conf import settings
from moderngl_window.finders.base import BaseFilesystemFinder

from .shader_root import PACKAGE_PREFIX, shader_root

__all__ = ["FINDER", "TexstreamShaderFinder", "register_finder"]

FINDER = f"{__name__}.TexstreamShaderFinder"


class TexstreamShaderFinder(BaseFilesystemFinder):
    """Finds ``texstream/<name>`` among texstream's shader files; leaves every other path alone."""

    settings_attr = "PROGRAM_DIRS"  # required by the base class; this finder does not search them

    def find(self, path: Path) -> Path | None:
        parts = Path(path).parts
        if len(parts) < 2 or parts[0] != PACKAGE_PREFIX.rstrip("/") or ".." in parts:
            return None
        found = Path(str(shader_root().joinpath(*parts[1:])))
        return found if found.is_file() else None


def register_finder() -> None:
    """Add `TexstreamShaderFinder` to moderngl-window's program finders (once)."""
    finders = list(settings.PROGRAM_FINDERS)
    if FINDER not in finders:
        settings.PROGRAM_FINDERS = [*finders, FINDER]
