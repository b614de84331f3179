"""Exception hierarchy. Every error the engine raises on purpose derives from `EngineError`."""

from __future__ import annotations

__all__ = [
    "EngineError",
    "PackFormatError",
    "PackNotFoundError",
    "TileCorruptError",
    "SourceError",
    "ShaderError",
    "BudgetError",
    "GLError",
    "first_line",
]


class EngineError(Exception):
    """Base class of every texstream error; its message is one line meant for the user."""


class PackFormatError(EngineError):
    """A pack file is malformed: bad magic, unsupported version, a field out of range."""


class PackNotFoundError(PackFormatError, FileNotFoundError):
    """A pack path names no file (a `FileNotFoundError` too, so `except FileNotFoundError` works)."""


class TileCorruptError(EngineError):
    """One tile's bytes are unreadable: checksum mismatch, truncated, or bad compressed data."""

    def __init__(self, message: str, level: int = -1, x: int = -1, y: int = -1) -> None:
        super().__init__(message)
        self.level, self.x, self.y = level, x, y


class SourceError(EngineError):
    """A source image cannot be read or has an unsupported shape or mode."""


class ShaderError(EngineError):
    """A GLSL file failed to load or compile; the message names file:line and the source line."""


class BudgetError(EngineError):
    """The VRAM budget cannot hold what must stay resident (pinned levels, page tables, ring)."""


class GLError(EngineError):
    """A GL call failed, or an entry point the engine needs is missing."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when empty): for one-line errors
    that wrap what a library raised."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
