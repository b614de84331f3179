"""The tile pack file: layout (`format`), reading (`reader`) and writing (`writer`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .format import (
    AddressMode,
    PackHeader,
    Supercompression,
    TexelFormat,
    level_count_for,
)

if TYPE_CHECKING:
    from .reader import PackReader, TileEntry
    from .writer import PackWriter

# The reader (and the remote files it reads through) and the writer are imported on first use: a
# bake needs only the writer, and a reader only the reader.
_LAZY = {"PackReader": ".reader", "TileEntry": ".reader", "PackWriter": ".writer"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


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
