"""The tile pack file: layout (`format`), reading (`reader`) and writing (`writer`)."""

from __future__ import annotations

from .format import (
    AddressMode,
    PackHeader,
    Supercompression,
    TexelFormat,
    level_count_for,
)
from .reader import PackReader, TileEntry
from .writer import PackWriter

__all__ = [
    "AddressMode",
    "PackHeader",
    "PackReader",
    "PackWriter",
    "Supercompression",
    "TexelFormat",
    "TileEntry",
    "level_count_for",
]
