"""`UpdateWatch`: notices a program that draws virtual textures but never calls `Streamer.update()`.

Without update() nothing streams and every texture stays at its pinned (blurred) levels, which looks
like a bug of the engine. One texture bound `NO_UPDATE_BINDS` times over `NO_UPDATE_SECONDS` without
an update() in between is that mistake; a slow frame drawing many textures once each is not.
"""

from __future__ import annotations

import logging
import time
import warnings

import numpy as np

from .tiles import MAX_TEXTURES

__all__ = ["NO_UPDATE_BINDS", "NO_UPDATE_SECONDS", "UpdateWatch"]

log = logging.getLogger(__name__)

NO_UPDATE_BINDS = 30  # one texture drawn this often without an update() ...
NO_UPDATE_SECONDS = 2.0  # ... over this long: the program forgot to call update()


class UpdateWatch:
    """Counts binds per texture id since the last update() and warns once (log and RuntimeWarning)."""

    def __init__(self) -> None:
        self._binds = np.zeros(MAX_TEXTURES, np.int64)
        self._last_update = time.monotonic()
        self._warned = False

    def updated(self) -> None:
        self._binds.fill(0)
        self._last_update = time.monotonic()

    def bound(self, tex_id: int) -> None:
        self._binds[tex_id] += 1
        n = int(self._binds[tex_id])
        if self._warned or n < NO_UPDATE_BINDS or time.monotonic() - self._last_update < NO_UPDATE_SECONDS:
            return
        self._warned = True
        message = (
            f"a virtual texture was drawn {n} times over {NO_UPDATE_SECONDS:g} s without "
            "Streamer.update(): nothing streams and it stays blurred; call streamer.update() once per frame"
        )
        log.warning("%s", message)
        warnings.warn(message, RuntimeWarning, stacklevel=5)
