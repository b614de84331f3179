"""Which GL calls carry one frame's uploads: runs of consecutive cache layers, and the time budget.

A call can write `count` consecutive layers at one cell of a cache pool from consecutive ring slots
(cell-major slot numbers: slot ``s`` is layer ``s % layers`` of cell ``s // layers``), so a frame's
loads, sorted by cache slot, split into maximal runs (`upload_runs`); `PoolUploads` is one pool's
share of a frame (its loads' ring slots and its runs) and `keep_within_budget` drops the least urgent
calls that do not fit ``StreamerConfig.upload_time_budget_ms``. Plain numpy; no GL, no thread
(`uploader.Uploader` plans with this and issues the calls).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .upload_budget import UploadCost, within_budget

__all__ = ["UPLOAD_RUN_DTYPE", "PoolUploads", "keep_within_budget", "upload_runs"]

#: One upload call: the first load of the run (an index into `PoolUploads.ring_slots`) and how many follow.
UPLOAD_RUN_DTYPE = np.dtype([("start", np.int64), ("count", np.int64)])


@dataclass(frozen=True)
class PoolUploads:
    """One pool's uploads of a frame: its loads' ring slots in cache-slot order, and the calls."""

    pool: int
    ring_slots: np.ndarray  # int64, sorted by the loads' cache slots
    runs: np.ndarray  # UPLOAD_RUN_DTYPE over `ring_slots`


def upload_runs(cache_slots: np.ndarray, ring_slots: np.ndarray, layers: int, max_run: int = 0) -> np.ndarray:
    """Maximal runs of loads (sorted by cache slot) that one upload call can write: consecutive
    cache layers at one cell (cell-major slots of a pool of `layers` layers) read from consecutive
    ring slots. A load missing from the list (cancelled, not ready, capped) ends a run. With
    `max_run` > 0 no run is longer (1: the per-tile path)."""
    c = np.asarray(cache_slots, np.int64)
    r = np.asarray(ring_slots, np.int64)
    n = c.size
    if n == 0:
        return np.zeros(0, UPLOAD_RUN_DTYPE)
    breaks = (np.diff(c) != 1) | (np.diff(r) != 1) | (c[1:] % layers == 0)
    starts = np.flatnonzero(np.concatenate([[True], breaks]))
    counts = np.diff(np.concatenate([starts, [n]]))
    if max_run > 0 and counts.max() > max_run:  # cut long runs into pieces of max_run loads
        pieces = -(-counts // max_run)
        k = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # piece of its run
        starts = np.repeat(starts, pieces) + k * max_run
        counts = np.minimum(max_run, np.repeat(counts, pieces) - k * max_run)
    out = np.empty(starts.size, UPLOAD_RUN_DTYPE)
    out["start"] = starts
    out["count"] = counts
    return out


def keep_within_budget(
    plan: list[PoolUploads], seq: np.ndarray, nbytes: np.ndarray, cost: UploadCost, budget_s: float
) -> list[PoolUploads]:
    """The calls of `plan` that fit `budget_s`, the most urgent (earliest submitted, `seq` per ring
    slot) first, at least one; `nbytes` per ring slot."""
    priority = np.concatenate([np.minimum.reduceat(seq[u.ring_slots], u.runs["start"]) for u in plan])
    sizes = np.concatenate([np.add.reduceat(nbytes[u.ring_slots], u.runs["start"]) for u in plan])
    keep = within_budget(priority, sizes, cost, budget_s)
    out, at = [], 0
    for u in plan:
        k = keep[at : at + u.runs.size]
        at += u.runs.size
        if not k.any():
            continue
        kept = u.runs[k].copy()
        kept["start"] = np.cumsum(kept["count"]) - kept["count"]
        out.append(PoolUploads(u.pool, u.ring_slots[np.repeat(k, u.runs["count"])], kept))
    return out
