"""Which GL calls carry one frame's uploads: runs of consecutive cache layers, and the time budget.

A call can write `count` consecutive layers at one cell of a cache pool from consecutive ring slots
(cell-major slot numbers: slot ``s`` is layer ``s % layers`` of cell ``s // layers``), so a frame's
loads, sorted by cache slot, split into maximal runs (`upload_runs`); `PoolUploads` is one pool's
share of a frame (its loads' ring slots and its runs) and `keep_within_budget` drops the least urgent
calls that do not fit ``StreamerConfig.upload_time_budget_ms``.

The device path (`UploadPath.DEVICE_BUFFER`, chosen by `choose_upload_path`) first copies the runs'
ring spans into a device-local buffer of `device_slots` slots, one copy per span of ring memory that
stays contiguous there too (`copy_spans`), and uploads the runs from it; the staging-texture path
(`UploadPath.STAGING_TEXTURE`, `texture_staging`) takes the same share of the budget. Plain numpy; no GL, no
thread (`uploader.Uploader` plans with this and issues the calls).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import StreamerConfig, UploadPath
from .upload_budget import UploadCost, within_budget

__all__ = [
    "DEVICE_MIN_SLOTS",
    "UPLOAD_RUN_DTYPE",
    "PoolUploads",
    "choose_upload_path",
    "copy_spans",
    "device_slots",
    "keep_within_budget",
    "upload_runs",
]

#: AUTO keeps the host ring when the device buffer would hold fewer tiles than this (tiny budgets):
#: a frame's uploads are capped at the device buffer's size, which would then bind.
DEVICE_MIN_SLOTS = 64

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
    starts = np.concatenate([[True], breaks]).nonzero()[0]
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


def device_slots(staging_slots: int, stride: int, config: StreamerConfig) -> int:
    """Slots of the device-local buffer carved out of `staging_slots` staging slots of `stride`
    bytes (the rest stay the host ring): two frames of uploads at the per-frame caps (tiles, and
    bytes: the first load always goes), so consecutive frames copy into different regions, but at
    most a quarter of the staging share (the host ring keeps the reads in flight), at least one."""
    per_frame = min(config.upload_tiles_per_frame, max(1, config.upload_bytes_per_frame // max(1, stride)))
    return max(1, min(2 * per_frame, staging_slots // 4))


def choose_upload_path(
    requested: UploadPath,
    *,
    buffer_storage: bool,
    video_memory: bool,
    device_slots: int,
    staging_texture: bool = False,
) -> UploadPath:
    """The path that runs: HOST_RING when asked, or without buffer storage (both device paths read a
    persistent-mapped ring on the GPU); DEVICE_BUFFER when asked; STAGING_TEXTURE when asked and
    `staging_texture` (the context runs its compute pass: `GLExt.has_staging_texture`), else
    DEVICE_BUFFER. AUTO takes the device buffer only where it wins: the driver reports dedicated
    video memory (on shared memory, llvmpipe included, the copy is one more pass over the same
    memory) and the share holds at least `DEVICE_MIN_SLOTS` tiles. AUTO never takes STAGING_TEXTURE:
    on the NVIDIA H200 it moves 1.3-1.7x the device buffer's tiles a second when the GPU's copies
    are the limit (`bench stream` (a)), but its copy calls cost the render thread more, and a drawn
    pan streamed 6-9 % fewer tiles a second through it than through the device buffer ((b),
    docs/BENCHMARKS.md); ask for it where the GPU's upload rate is what binds."""
    if requested is UploadPath.HOST_RING or not buffer_storage:
        return UploadPath.HOST_RING
    if requested in (UploadPath.DEVICE_BUFFER, UploadPath.STAGING_TEXTURE):
        return (
            UploadPath.STAGING_TEXTURE
            if requested is UploadPath.STAGING_TEXTURE and staging_texture
            else (UploadPath.DEVICE_BUFFER)
        )
    if not video_memory or device_slots < DEVICE_MIN_SLOTS:
        return UploadPath.HOST_RING
    return UploadPath.DEVICE_BUFFER


def copy_spans(ring_first: np.ndarray, device_first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The buffer copies that bring runs into the device buffer: run i is `counts[i]` slots from
    ring slot `ring_first[i]` to device slot `device_first[i]`; consecutive runs contiguous in both
    buffers share one copy. Returns UPLOAD_RUN_DTYPE-like rows (``ring``, ``device``, ``count``)."""
    r = np.asarray(ring_first, np.int64)
    d = np.asarray(device_first, np.int64)
    c = np.asarray(counts, np.int64)
    out = np.empty(0, COPY_SPAN_DTYPE)
    if r.size == 0:
        return out
    joins = (r[:-1] + c[:-1] == r[1:]) & (d[:-1] + c[:-1] == d[1:])
    starts = np.concatenate([[True], ~joins]).nonzero()[0]
    out = np.empty(starts.size, COPY_SPAN_DTYPE)
    out["ring"] = r[starts]
    out["device"] = d[starts]
    out["count"] = np.add.reduceat(c, starts)
    return out


#: One buffer copy: from ring slot ``ring`` to device slot ``device``, ``count`` slots.
COPY_SPAN_DTYPE = np.dtype([("ring", np.int64), ("device", np.int64), ("count", np.int64)])
