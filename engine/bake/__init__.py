"""Offline baking: source image (or procedural pattern) -> mip pyramid -> bordered tiles -> BCn -> pack.

Public entry points: `bake` (any `Source`), `bake_file` (an image file) and `bake_procedural`
(a generated pattern of any size); sources live in `source` and `procedural`.
"""

from __future__ import annotations

from .pipeline import BakeReport, bake, bake_file, bake_procedural, plan_stages
from .procedural import PATTERNS, ProceduralSource
from .source import ArraySource, PillowSource, Source, VipsSource, open_source

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
