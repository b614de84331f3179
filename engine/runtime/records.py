"""What the movers report back to the residency core: records of loads (parallel arrays), no GL.

The uploader returns these (`Drained` after draining the I/O threads, `Uploaded` after issuing
uploads, `LoadRecords` for cancelled loads); `residency.Residency.apply` folds them into the ledgers,
the page tables and the scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Drained", "LoadRecords", "Uploaded"]


@dataclass(frozen=True)
class LoadRecords:
    """Loads named by the uploader's results (parallel arrays)."""

    tiles: np.ndarray
    tex: np.ndarray
    pool: np.ndarray
    cache_slot: np.ndarray

    @classmethod
    def empty(cls) -> LoadRecords:
        z = np.zeros(0, np.int64)
        return cls(z, z, z, z)

    def __len__(self) -> int:
        return int(self.tiles.size)

    def select(self, mask: np.ndarray) -> LoadRecords:
        return LoadRecords(self.tiles[mask], self.tex[mask], self.pool[mask], self.cache_slot[mask])

    @classmethod
    def concat(cls, parts: Sequence[LoadRecords]) -> LoadRecords:
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("tiles", "tex", "pool", "cache_slot")))


@dataclass(frozen=True)
class Drained:
    """What `drain` found: loads that failed (their cache slots are to be freed, their tiles backed
    off), with a reason each, and how many reads became READY."""

    failed: LoadRecords
    reasons: list[str]
    ready: int
    read_seconds: list[float] = field(default_factory=list)  # per batch, on its I/O thread


@dataclass(frozen=True)
class Uploaded:
    """Loads whose upload was issued this frame (their cache slots now hold the tiles)."""

    loads: LoadRecords
    latency_frames: np.ndarray  # frames from submit to upload, per load
    nbytes: int
