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
    "GltfError",
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
    """The VRAM budget cannot hold what must stay resident (pinned levels, page tables, ring).

    The message says what did not fit and, where it is known, the smallest budget that would have
    (``BudgetConfig.budget_mb``) and whether fewer pinned levels (``StreamerConfig.pinned_levels``)
    would help. A program with its own settings words the same advice with `advice`.

    Attributes
    ----------
    problem : str
        What did not fit, without the advice.
    minimum_bytes : int or None
        The smallest budget in which it would have fitted (None when not known).
    pinned_levels : bool
        Whether lowering ``StreamerConfig.pinned_levels`` also makes it fit in less.
    """

    def __init__(self, problem: str, *, minimum_bytes: int | None = None, pinned_levels: bool = False) -> None:
        self.problem, self.minimum_bytes, self.pinned_levels = problem, minimum_bytes, pinned_levels
        super().__init__(self.advice())

    def advice(
        self,
        budget_setting: str = "BudgetConfig.budget_mb",
        pinned_setting: str | None = "StreamerConfig.pinned_levels",
    ) -> str:
        """The message, naming the settings as `budget_setting` and `pinned_setting` (a command line
        passes its flags, e.g. ``"--budget-mb"``; None where it has no such setting)."""
        if self.minimum_bytes is None:
            return self.problem
        mib = -(-self.minimum_bytes // 2**20)  # whole MiB, rounded up
        if budget_setting.startswith("-"):  # a command-line flag
            fix = f"{self.problem}: pass {budget_setting} {mib} or more"
        else:
            fix = f"{self.problem}: set {budget_setting} to at least {mib}"
        return f"{fix}, or lower {pinned_setting}" if self.pinned_levels and pinned_setting else fix


class GLError(EngineError):
    """A GL call failed, or an entry point the engine needs is missing."""


class GltfError(SourceError):
    """A glTF file cannot be drawn: malformed, truncated, a broken reference or an absurd count;
    the message names the file and the object (``accessors[3]: ...``)."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when empty): for one-line errors
    that wrap what a library raised."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
