"""What one `Streamer.update()` did (`FrameStats`), and the plain-dict view `Streamer.stats()` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .uploader import Uploaded

if TYPE_CHECKING:
    from .streamer import Streamer

__all__ = ["FrameStats", "stats_dict"]

_FRAME_KEYS = ("frame", "update_ms", "upload_ms", "uploads", "upload_bytes", "requested", "wanted_pages",
               "missing_pages", "in_flight", "queued", "failed", "feedback_age")  # fmt: skip


def _empty() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass
class FrameStats:
    """Counters and records of one update(); `Streamer.stats()` returns the latest with running totals."""

    frame: int = 0
    update_ms: float = 0.0
    update_cpu_ms: float = 0.0  # the render thread's own CPU time in update() (no driver or lock waits)
    upload_ms: float = 0.0
    uploads: int = 0
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
    latency_frames: np.ndarray = field(default_factory=_empty)
    read_batches: int = 0
    read_seconds: float = 0.0  # summed wall time of the drained read batches on their I/O threads
    uploaded: Uploaded | None = None  # the loads uploaded (tiles and cache slots), for tools and tests
    evicted_tiles: np.ndarray = field(default_factory=_empty)
    evicted_age: np.ndarray = field(default_factory=_empty)  # frames since each evicted tile's last use


def stats_dict(s: Streamer) -> dict[str, Any]:
    """Telemetry of `s`'s latest update() plus running totals (plain dict, stable keys)."""
    st = s.last
    lat = np.array(s.latencies) if s.latencies else np.zeros(1)
    p50, p95, p99 = (float(v) for v in np.percentile(lat, [50, 95, 99]))
    ring = s.uploader.ring if s.uploader is not None else None
    net = s.network()
    working_set, stream_cache = _working_set_bytes(s)
    return {
        **{k: getattr(st, k) for k in _FRAME_KEYS},
        "vram_bytes": s.budget.usage,
        "vram_peak_bytes": s.budget.peak,
        "budget_bytes": s.budget.budget,
        "budget_source": s.budget.source,
        "vram_breakdown": s.budget.breakdown(),
        "mip_bias": s.budget.bias,
        "resident_tiles": int(s.tables.resident_count.sum()),
        "working_set_bytes": working_set,
        "stream_cache_bytes": stream_cache,
        "corrupt_tiles": sum(vt.corrupt_tiles for vt in s.textures),
        "latency_p50_frames": p50,
        "latency_p95_frames": p95,
        "latency_p99_frames": p99,
        "ring_occupancy": 1.0 - ring.free_count / ring.slot_count if ring is not None else 0.0,
        "ring_stalls": ring.stall_count if ring is not None else 0,
        "feedback_frozen": s.freeze_feedback,
        "feedback_dropped": s.feedback.dropped,
        "totals": dict(s.totals),
        "remote_packs": net.remote_packs,
        "net_requests": net.requests,
        "net_failed_requests": net.failed_requests,
        "net_retries": net.retries,
        "net_bytes": net.net_bytes,
        "net_latency_p50_ms": net.latency_p50_ms,
        "net_latency_p95_ms": net.latency_p95_ms,
        "net_offline": net.offline,
        "cache_hits": net.cache_hits,
        "cache_misses": net.cache_misses,
        "cache_hit_rate": net.cache_hit_rate,
        "cache_bytes": net.cache_bytes,
        "cache_capacity_bytes": net.cache_capacity_bytes,
    }


def _working_set_bytes(s: Streamer) -> tuple[int, int]:
    """GPU bytes of the newest feedback's pages at full detail (no mip bias) with their parents, and
    of the cache slots streamed tiles can use; coarsest pinned levels excluded from both. The
    pressure the mip bias answers: the budget holds the view's detail while the first fits the second."""
    need = room = 0
    if s.textures:
        pressure = s.pressure(s.sampled)
        for pool in s.pools.values():
            tiles, slots = pressure[pool.name]
            need += tiles * pool.geometry.slot_bytes
            room += slots * pool.geometry.slot_bytes
    return need, room
