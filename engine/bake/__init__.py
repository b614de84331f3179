"""Offline baking: source image (or procedural pattern) -> mip pyramid -> bordered tiles -> BCn -> pack.

Public entry points: `bake` (any `Source`), `bake_file` (an image file) and `bake_procedural`
(a generated pattern of any size); sources live in `source` and `procedural`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

# Each name -> the submodule that defines it, imported on first use (PEP 562): a bake of an image
# file imports neither the procedural generators nor the libvips reader's helpers.
_EXPORTS = {
    ".pipeline": ("BakeReport", "bake", "bake_file", "bake_procedural", "plan_stages"),
    ".procedural": ("PATTERNS", "ProceduralSource"),
    ".source": ("ArraySource", "PillowSource", "Source", "VipsSource", "open_source"),
}

if TYPE_CHECKING:
    from .pipeline import BakeReport, bake, bake_file, bake_procedural, plan_stages
    from .procedural import PATTERNS, ProceduralSource
    from .source import ArraySource, PillowSource, Source, VipsSource, open_source

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "PATTERNS",
    "ArraySource",
    "BakeReport",
    "PillowSource",
    "ProceduralSource",
    "Source",
    "VipsSource",
    "bake",
    "bake_file",
    "bake_procedural",
    "open_source",
    "plan_stages",
]
