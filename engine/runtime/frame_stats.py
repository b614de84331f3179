"""The streamer's typed read-only views: what one `Streamer.update()` did (`FrameStats`), what
`Streamer.stats()` returns (`StreamerStats`), `IOStatus` and `FeedbackInfo`. Built from the residency
core, the budget and the movers' own status records; nothing here reads a streamer's internals."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..config import UploadPath
from ..remote import NetworkSummary
from .budget import BudgetManager
from .device_staging import DeviceStagingStats
from .records import Uploaded
from .residency import Residency, StreamTotals
from .staging import RingStats
from .texture_staging import TextureStagingStats

__all__ = [
    "PHASES",
    "FeedbackInfo",
    "FrameStats",
    "IOStatus",
    "PhaseClock",
    "StreamTotals",
    "StreamerStats",
    "streamer_stats",
]

#: `FrameStats` fields timing update()'s phases, in the order a frame runs them.
PHASES = (
    "feedback_ms",
    "reduce_ms",
    "drain_ms",
    "upload_ms",
    "select_ms",
    "reserve_ms",
    "submit_ms",
    "page_table_ms",
    "stats_ms",
)

_FRAME_KEYS = (
    "frame",
    "update_ms",
    "upload_ms",
    "uploads",
    "upload_bytes",
    "requested",
    "wanted_pages",
    "missing_pages",
    "in_flight",
    "queued",
    "failed",
    "feedback_age",
)


class PhaseClock:
    """Wall time between consecutive `lap()` calls, in ms (update()'s phase timings)."""

    def __init__(self) -> None:
        self._start = self._t = time.perf_counter()

    def total(self) -> float:
        """Ms since the clock started."""
        return (time.perf_counter() - self._start) * 1e3

    def lap(self) -> float:
        t = time.perf_counter()
        ms, self._t = (t - self._t) * 1e3, t
        return ms


def _empty() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass
class FrameStats:
    """Counters and records of one update(); `Streamer.stats()` returns the latest with running totals."""

    frame: int = 0
    update_ms: float = 0.0
    update_cpu_ms: float = 0.0  # the render thread's own CPU time in update() (no driver or lock waits)
    upload_ms: float = 0.0  # issuing the uploads and folding them into the residency core
    # update()'s other phases, wall ms (`PhaseClock`): their sum with upload_ms is nearly update_ms
    feedback_ms: float = 0.0  # closing this frame's feedback buffer, collecting signalled ones, opening the next
    reduce_ms: float = 0.0  # the feedback reduction, mip-bias step and LRU touch (`Residency.observe`)
    drain_ms: float = 0.0  # taking the I/O threads' finished batches, folding failures in
    select_ms: float = 0.0  # the request scheduler: dedup against resident and in-flight, order, caps
    reserve_ms: float = 0.0  # cache slots for the chosen loads, evictions, the pools' free reserve
    submit_ms: float = 0.0  # handing the loads to the I/O threads
    page_table_ms: float = 0.0  # uploading the changed page-table entries
    stats_ms: float = 0.0  # this record's counters (missing pages, queue depth)
    uploads: int = 0
    upload_calls: int = 0  # sub-image calls issued (one per run of consecutive cache layers)
    upload_bytes: int = 0
    requested: int = 0
    wanted_pages: int = 0
    missing_pages: int = 0
    in_flight: int = 0
    queued: int = 0
    evicted: int = 0
    stalls: int = 0
    failed: int = 0
    feedback_age: int = -1
    feedback_stride: int = 0  # the coming draws record one fragment per stride x stride pixels (dense: halved)
    latency_frames: np.ndarray = field(default_factory=_empty)
    read_batches: int = 0
    read_seconds: float = 0.0  # summed wall time of the drained read batches on their I/O threads
    uploaded: Uploaded | None = None  # the loads uploaded (tiles and cache slots), for tools and tests
    evicted_tiles: np.ndarray = field(default_factory=_empty)
    evicted_age: np.ndarray = field(default_factory=_empty)  # frames since each evicted tile's last use


@dataclass(frozen=True)
class IOStatus:
    """`Streamer.io_status()`: the reader threads and the staging ring."""

    threads: int  # threads taking new batches
    stuck_threads: int  # retired threads still inside a read that was given up
    pending_batches: int  # batches submitted and not yet drained
    compiled: bool  # reads and uploads run in the compiled helper (texstream.native)
    ring: RingStats | None  # None before the first texture opens
    upload_path: UploadPath | None = None  # the path the uploads take (None before the first texture opens)
    device_staging: DeviceStagingStats | None = None  # the device path's buffer (None on the host ring)
    texture_staging: TextureStagingStats | None = None  # the staging-texture path's arrays (None elsewhere)


@dataclass(frozen=True)
class FeedbackInfo:
    """`Streamer.feedback_info()`: the feedback buffers the draws write wanted pages into."""

    depth: int  # buffers in the ring (one per frame in flight)
    nbytes_each: int
    stride: int  # one feedback texel per stride x stride pixels
    capacity: int  # entries each buffer holds
    dropped: int  # entries lost to a full buffer so far
    frozen: bool  # feedback is read but ignored (`Streamer.freeze_feedback`)
    compacted: bool = False  # reduced to unique pages on the GPU before the readback (compute shaders)


@dataclass(frozen=True)
class StreamerStats:
    """What `Streamer.stats()` reports: the latest `update()` and the streamer as a whole.

    Attributes
    ----------
    frame : int
        `Streamer.frame` after the latest update.
    update_ms, upload_ms : float
        Wall time of the latest `update()`, and the part of it spent issuing uploads.
    uploads, upload_bytes : int
        Tiles (bytes) uploaded by the latest update.
    requested, wanted_pages, missing_pages, in_flight, queued, failed : int
        Loads issued; pages the newest feedback wants; of those, not resident at their level; loads
        with the I/O threads; requests waiting; loads that failed, in the latest update.
    feedback_age : int
        Frames between the newest feedback read and the frame it was drawn in (-1 before any).
    vram_bytes, vram_peak_bytes, budget_bytes : int
        GPU memory the engine holds, its peak, and the budget (never exceeded).
    budget_source : str
        Where the budget came from: ``config``, ``driver``, ``fallback`` or ``runtime``.
    vram_breakdown : dict[str, int]
        Bytes per allocation (``pool/...``, ``page-table/N``, ``staging-ring``, ``feedback``).
    mip_bias : float
        Levels the budget controller coarsens the feedback by (0: full detail).
    resident_tiles, corrupt_tiles : int
        Tiles in the cache; distinct tiles whose load failed (every open texture).
    working_set_bytes, stream_cache_bytes : int
        GPU bytes of the newest feedback's pages at full detail with their parents (pinned levels
        excluded), and of the cache slots streamed tiles can use: the pressure the mip bias answers.
    latency_p50_frames, latency_p95_frames, latency_p99_frames : float
        Frames from request to residency of the latest 4096 uploads.
    ring_occupancy : float
        Fraction of staging-ring slots in use; ``ring_stalls`` counts acquires that found none.
    feedback_frozen : bool
        Feedback is read but ignored (`Streamer.freeze_feedback`).
    feedback_dropped : int
        Feedback entries lost to a full feedback buffer so far.
    totals : StreamTotals
        Running totals.
    remote_packs, net_requests, net_failed_requests, net_retries, net_bytes : int
        Open textures read by URL and their network counters (totals).
    net_latency_p50_ms, net_latency_p95_ms : float
        Recent range-request times of the open remote packs.
    net_offline : bool
        A remote pack's server could not be reached a moment ago.
    cache_hits, cache_misses, cache_bytes, cache_capacity_bytes : int
        The remote-pack disk cache: blocks found / fetched, bytes held, bound.
    cache_hit_rate : float
        ``cache_hits / (cache_hits + cache_misses)`` (0 before any).
    upload_path : str
        The path the uploads take (`UploadPath` value: ``host-ring``, ``device-buffer`` or ``staging-texture``; empty
        before the first texture opens).
    """

    frame: int
    update_ms: float
    upload_ms: float
    uploads: int
    upload_bytes: int
    requested: int
    wanted_pages: int
    missing_pages: int
    in_flight: int
    queued: int
    failed: int
    feedback_age: int
    vram_bytes: int
    vram_peak_bytes: int
    budget_bytes: int
    budget_source: str
    vram_breakdown: dict[str, int]
    mip_bias: float
    resident_tiles: int
    working_set_bytes: int
    stream_cache_bytes: int
    corrupt_tiles: int
    latency_p50_frames: float
    latency_p95_frames: float
    latency_p99_frames: float
    ring_occupancy: float
    ring_stalls: int
    feedback_frozen: bool
    feedback_dropped: int
    totals: StreamTotals
    remote_packs: int
    net_requests: int
    net_failed_requests: int
    net_retries: int
    net_bytes: int
    net_latency_p50_ms: float
    net_latency_p95_ms: float
    net_offline: bool
    cache_hits: int
    cache_misses: int
    cache_hit_rate: float
    cache_bytes: int
    cache_capacity_bytes: int
    upload_path: str = ""

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (``totals`` a nested dict) for JSON export."""
        return asdict(self)


def streamer_stats(
    last: FrameStats,
    core: Residency,
    budget: BudgetManager,
    ring: RingStats | None,
    net: NetworkSummary,
    feedback: FeedbackInfo,
    corrupt_tiles: int,
    upload_path: str = "",
) -> StreamerStats:
    """The latest update() plus running totals, from the parts that own them."""
    p50, p95, p99 = core.latency_percentiles()
    need = room = 0
    for p, (tiles, slots) in core.pressure(core.sampled).items():
        # the pressure the mip bias answers: the newest feedback's pages at full detail with their
        # parents against the slots streamed tiles can use (pinned levels excluded from both)
        g = core.geometry[p]
        assert g is not None
        need += tiles * g.slot_bytes
        room += slots * g.slot_bytes
    return StreamerStats(
        **{k: getattr(last, k) for k in _FRAME_KEYS},
        vram_bytes=budget.usage,
        vram_peak_bytes=budget.peak,
        budget_bytes=budget.budget,
        budget_source=budget.source,
        vram_breakdown=budget.breakdown(),
        mip_bias=budget.bias,
        resident_tiles=core.resident_tiles,
        working_set_bytes=need if core.headers else 0,
        stream_cache_bytes=room if core.headers else 0,
        corrupt_tiles=corrupt_tiles,
        latency_p50_frames=p50,
        latency_p95_frames=p95,
        latency_p99_frames=p99,
        ring_occupancy=ring.occupancy if ring is not None else 0.0,
        ring_stalls=ring.stalls if ring is not None else 0,
        feedback_frozen=feedback.frozen,
        feedback_dropped=feedback.dropped,
        totals=core.totals(),
        remote_packs=net.remote_packs,
        net_requests=net.requests,
        net_failed_requests=net.failed_requests,
        net_retries=net.retries,
        net_bytes=net.net_bytes,
        net_latency_p50_ms=net.latency_p50_ms,
        net_latency_p95_ms=net.latency_p95_ms,
        net_offline=net.offline,
        cache_hits=net.cache_hits,
        cache_misses=net.cache_misses,
        cache_hit_rate=net.cache_hit_rate,
        cache_bytes=net.cache_bytes,
        cache_capacity_bytes=net.cache_capacity_bytes,
        upload_path=upload_path,
    )
