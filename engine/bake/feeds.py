"""The baking process's side of a stage's input: `StageFeed` hands a stage's rows out as overlapping
band windows, from the source, from the previous stage's results, or from a `LevelRing` in shared
memory that the previous stage's workers write to."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from ..errors import EngineError
from .jobs import JobResult, LevelRing, Stage
from .source import Source

__all__ = ["StageFeed"]


class StageFeed:
    """The input rows of one stage, arriving in order, handed out as overlapping band windows.

    Stage 0 either reads the source here (`source`), or leaves reading to the workers (`remote`);
    later stages receive the previous stage's output rows through `add`.
    """

    def __init__(
        self, stage: Stage, source: Source | None = None, remote: bool = False, texels: np.dtype | None = None
    ) -> None:
        self.stage = stage
        self.source = source
        self.remote = remote
        self.next_band = 0
        self.chunks: list[tuple[int, np.ndarray]] = []
        self.have = 0  # rows [0, have) have arrived
        # stage 0: the source's texels (uint8, or a float source's float32); later stages: float32
        self.dtype = np.dtype(texels or np.uint8) if stage.index == 0 else np.dtype(np.float32)
        self.top: JobResult | None = None
        self.bottom: JobResult | None = None
        self.deferred_sent = False
        # Where the rows are held: `chunks` (arrays taken from results), or a `LevelRing` in the
        # shared memory that the previous stage's bands write to directly (`add_rows` then only
        # counts them); `in_flight` holds the window starts of this stage's unfinished bands.
        self.ring: LevelRing | None = None
        self.in_flight: deque[int] = deque()

    @property
    def finished(self) -> bool:
        return self.next_band >= self.stage.bands

    def add(self, start: int, rows: np.ndarray) -> None:
        assert start == self.have, f"stage {self.stage.index}: rows {start}.. arrived after {self.have}"
        if rows.shape[0]:
            self.chunks.append((start, rows))
            self.have += rows.shape[0]

    def add_rows(self, start: int, count: int) -> None:
        """Rows [start, start + count) are in `ring` now."""
        assert start == self.have, f"stage {self.stage.index}: rows {start}.. arrived after {self.have}"
        self.have += count

    def lowest_needed(self) -> int:
        """The first row an unfinished or future band of this stage still reads from `ring`."""
        if self.in_flight:
            return self.in_flight[0]
        return self.stage.window(self.next_band)[0] if not self.finished else self.have

    def ready(self) -> bool:
        if self.finished:
            return False
        if self.source is not None or self.remote:
            return True
        return self.have >= self.stage.window(self.next_band)[1]

    def window_rows(self, out: np.ndarray | None = None) -> np.ndarray:
        """Rows of the next band's window (reading the source as needed), copied into `out` if given
        (else a view when possible); then drops the rows no later band needs."""
        lo, hi = self.stage.window(self.next_band)
        into = getattr(self.source, "read_rows_into", None)
        if out is not None and self.source is not None and self.have < hi and callable(into):
            return self._window_into(lo, hi, out, into)
        if self.source is not None and self.have < hi:
            rows = self.source.read_rows(self.have, hi)
            if rows.shape != (hi - self.have, self.stage.width, 4) or rows.dtype != self.dtype:
                raise EngineError(
                    f"source {self.source.name} returned {rows.shape} {rows.dtype} for rows "
                    f"{self.have}..{hi}, expected ({hi - self.have}, {self.stage.width}, 4) {self.dtype}"
                )
            self.add(self.have, rows)
        parts = [(s, c) for s, c in self.chunks if s < hi and s + c.shape[0] > lo]
        if out is None and len(parts) == 1 and parts[0][0] <= lo and parts[0][0] + parts[0][1].shape[0] >= hi:
            s, c = parts[0]
            rows = c[lo - s : hi - s]
        else:
            rows = out if out is not None else np.empty((hi - lo, self.stage.width, 4), self.dtype)
            for s, c in parts:
                a, z = max(lo, s), min(hi, s + c.shape[0])
                rows[a - lo : z - lo] = c[a - s : z - s]
        self._drop(hi)
        return rows

    def _window_into(self, lo: int, hi: int, out: np.ndarray, into: Callable) -> np.ndarray:
        """The source writes the new rows straight into `out`; rows later bands share are kept."""
        for s, c in self.chunks:  # rows [lo, have) from the previous window's tail
            a, z = max(lo, s), min(self.have, s + c.shape[0])
            if z > a:
                out[a - lo : z - lo] = c[a - s : z - s]
        into(self.have, hi, out[self.have - lo :])
        nxt = self.stage.window(self.next_band + 1)[0] if self.next_band + 1 < self.stage.bands else hi
        self.chunks = [(nxt, out[nxt - lo :].copy())] if nxt < hi else []  # `out` is recycled later
        self.have = hi
        return out

    def _drop(self, hi: int) -> None:
        nxt = self.stage.window(self.next_band + 1)[0] if self.next_band + 1 < self.stage.bands else hi
        self.chunks = [(s, c) if s >= nxt else (nxt, c[nxt - s :]) for s, c in self.chunks if s + c.shape[0] > nxt]
