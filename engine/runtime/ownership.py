"""`RenderThreadOwned`: the lifetime rules of an object bound to one GL context and its thread.

The object belongs to the thread that made it (its GL context is current there): a call from
another thread, after `release()`, or after the context was released is an `EngineError` naming
the problem. It releases itself on ``with`` exit, and when collected on its own thread without a
`release()` (with a `ResourceWarning`, as an unclosed file).
"""

from __future__ import annotations

import threading
import warnings
from types import TracebackType
from typing import Self

import moderngl

from ..errors import EngineError

__all__ = ["RenderThreadOwned"]


class RenderThreadOwned:
    """Base of `Streamer`: thread and lifetime checks; subclasses implement `release`."""

    ctx: moderngl.Context
    _closed = True  # until the subclass's __init__ has made everything release() frees
    _owner: int | None = None

    def _claim(self) -> None:
        """Called first by the subclass's __init__: the current thread owns the object."""
        self._owner = threading.get_ident()

    @property
    def _context_released(self) -> bool:
        return type(self.ctx.mglo).__name__ == "InvalidObject"  # what moderngl leaves after ctx.release()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError(f"{type(self).__name__.lower()} is released")
        self._check_thread()
        if self._context_released:
            name = type(self).__name__.lower()
            raise EngineError(f"the {name}'s GL context was released before the {name}")

    def _check_thread(self) -> None:
        if threading.get_ident() != self._owner:
            raise EngineError(
                f"{type(self).__name__.lower()} used from thread {threading.current_thread().name!r}: it belongs "
                "to the thread that made it (the one its GL context is current on)"
            )

    def release(self) -> None:
        raise NotImplementedError

    def __del__(self) -> None:
        if self._closed or threading.get_ident() != self._owner:
            return
        warnings.warn(f"{self!r} was not released; releasing it now", ResourceWarning, stacklevel=1)
        try:
            self.release()
        except Exception:  # noqa: BLE001 (collection at exit: the context may be gone)
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
