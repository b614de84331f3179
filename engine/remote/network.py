"""Network figures of remote packs: each open file's `RemoteStats` and their sum over a streamer's
textures (`NetworkSummary`), closed textures' totals kept in `NetworkCounters`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .cache import CacheStats

if TYPE_CHECKING:
    pass

__all__ = ["NetworkCounters", "NetworkSummary", "RemoteStats", "summarize"]


@dataclass(frozen=True)
class RemoteStats:
    """Network and cache figures of one remote pack (counters are totals since it was opened)."""

    requests: int
    failed_requests: int
    retries: int
    net_bytes: int  # bytes received
    cache_hits: int  # blocks found in the cache
    cache_misses: int  # blocks fetched
    latency_ms: tuple[float, ...]  # recent request latencies (newest last)
    offline: bool  # requests fail at once for now (the server could not be reached, or asked to wait)
    cache: CacheStats | None  # the shared cache; None when running without one


@dataclass
class NetworkCounters:
    """Running totals of remote packs that were closed (their `RemoteStats` end with them)."""

    requests: int = 0
    failed_requests: int = 0
    retries: int = 0
    net_bytes: int = 0
    cache_hits: int = 0
    cache_misses: int = 0

    def add(self, s: RemoteStats) -> None:
        self.requests += s.requests
        self.failed_requests += s.failed_requests
        self.retries += s.retries
        self.net_bytes += s.net_bytes
        self.cache_hits += s.cache_hits
        self.cache_misses += s.cache_misses


@dataclass(frozen=True)
class NetworkSummary:
    """Every remote pack of a streamer together: what telemetry shows."""

    remote_packs: int  # open now
    requests: int
    failed_requests: int
    retries: int
    net_bytes: int
    cache_hits: int
    cache_misses: int
    latency_p50_ms: float  # recent requests of the open packs; 0 without any
    latency_p95_ms: float
    offline: bool  # some open pack's server could not be reached a moment ago
    cache_bytes: int
    cache_capacity_bytes: int

    @property
    def cache_hit_rate(self) -> float:
        """Blocks found in the cache over blocks needed (0 before any)."""
        total = self.cache_hits + self.cache_misses
        return self.cache_hits / total if total else 0.0


def summarize(open_files: list[RemoteStats], closed: NetworkCounters) -> NetworkSummary:
    totals = NetworkCounters(**vars(closed))
    for s in open_files:
        totals.add(s)
    latency = np.concatenate([np.asarray(s.latency_ms, np.float64) for s in open_files] + [np.zeros(0)])
    p50, p95 = (float(v) for v in np.percentile(latency, [50, 95])) if latency.size else (0.0, 0.0)
    caches = {id(s.cache): s.cache for s in open_files if s.cache is not None}  # one shared cache counts once
    return NetworkSummary(
        remote_packs=len(open_files),
        requests=totals.requests,
        failed_requests=totals.failed_requests,
        retries=totals.retries,
        net_bytes=totals.net_bytes,
        cache_hits=totals.cache_hits,
        cache_misses=totals.cache_misses,
        latency_p50_ms=p50,
        latency_p95_ms=p95,
        offline=any(s.offline for s in open_files),
        cache_bytes=max((c.used_bytes for c in caches.values()), default=0),
        cache_capacity_bytes=max((c.capacity_bytes for c in caches.values()), default=0),
    )
