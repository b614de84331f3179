"""The bake's progress bar (tqdm on stderr), shown only once a bake has run `PROGRESS_DELAY_S`: a
shorter bake shows none and never imports tqdm (about 30 ms of CPU time, a tenth of a 2048² bake's
command)."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["PROGRESS_DELAY_S", "DelayedBar"]

PROGRESS_DELAY_S = 0.5
"""Seconds a bake with ``BakeConfig.progress`` runs before its progress bar appears."""


class DelayedBar:
    """Tiles done out of `total`, drawn from `PROGRESS_DELAY_S` after `start` on (never when not
    `enabled`)."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.total, self.desc, self.enabled = total, desc, enabled
        self.began = time.perf_counter()
        self.done = 0
        self._bar: Any = None

    def start(self) -> None:
        self.began = time.perf_counter()

    def update(self, tiles: int) -> None:
        self.done += tiles
        if self._bar is not None:
            self._bar.update(tiles)
        elif self.enabled and time.perf_counter() - self.began >= PROGRESS_DELAY_S:
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total, initial=self.done, unit="tile", desc=self.desc, leave=False, dynamic_ncols=True
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
