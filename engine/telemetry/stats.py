"""Per-frame telemetry of a `Streamer`: frame records, rolling histories, JSONL export, run summary.

Typical loop::

    telemetry = Telemetry(streamer)              # dt=1/60 for deterministic benchmark figures
    telemetry.write_jsonl("run.jsonl")           # optional: one line per frame from now on
    while running:
        telemetry.update()                       # = streamer.update(), timed, then recorded
        telemetry.gpu_begin()
        draw_scene()                             # the draws that sample the virtual textures
        telemetry.gpu_end()
        overlay.draw(telemetry, fb_size)         # optional HUD (texstream.telemetry.Overlay)
    telemetry.write_summary("summary.json")
    telemetry.release()

Each frame record is a `FrameRecord` (typed attributes) whose fields are listed in `FRAME_SCHEMA`
(docs/TELEMETRY.md);
`summary()` returns a `SUMMARY_SCHEMA` dict for the whole run. Rates (upload MB/s, evictions/s)
use a frame clock: real time (``time.perf_counter``) by default, or a fixed ``dt`` per frame so that
a scripted benchmark gives the same figures on every machine. CPU and GPU timings are always measured.

Cost per frame: a handful of numpy operations over the history rings (`history` entries) and one
comparison over the cache's slot states (re-fetch detection); no Python loop over tiles.
"""

from __future__ import annotations

import array
import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from ..gl.loader import Feature
from ..gl.objects import GpuTimer
from .schema import FRAME_FIELDS, FrameRecord, validate_summary

if TYPE_CHECKING:
    from ..runtime.frame_stats import StreamerStats
    from ..runtime.streamer import Streamer

__all__ = ["HISTORY_SERIES", "History", "Telemetry"]

log = logging.getLogger(__name__)

MB = 1_000_000
MAX_GPU_MS = 10_000.0  # a longer GPU frame time is a driver error, not a measurement
HISTORY_SERIES = (
    "dt_s",
    "update_ms",
    "gpu_ms",  # NaN where no GPU time finished that frame
    "uploads",
    "upload_bytes",
    "upload_mb_s",
    "evicted",
    "evictions_per_s",
    "vram_bytes",
    "mip_bias",
    "missing_pages",
    "in_flight",
    "queued",
    "net_bytes",  # bytes received from remote packs' servers this frame
    "net_mb_s",
)
_LATENCY_BINS = 4096  # run-wide latency histogram: one bin per frame, the last bin collects the rest
_TOTALS = ("uploads", "upload_bytes", "evicted", "failed", "requested", "cancelled")
# update()'s phases besides upload_ms, as FrameStats times them (runtime.frame_stats.PHASES)
_PHASES = ("feedback_ms", "reduce_ms", "drain_ms", "select_ms", "reserve_ms", "submit_ms", "page_table_ms", "stats_ms")


class History:
    """A fixed-size ring of float64 samples; `values()` returns them oldest first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"history capacity must be >= 1, got {capacity!r}")
        self._data = np.full(capacity, np.nan)
        self._next = 0
        self._count = 0

    @property
    def capacity(self) -> int:
        return int(self._data.size)

    def __len__(self) -> int:
        return self._count

    def push(self, value: float) -> None:
        self._data[self._next] = value
        self._next = (self._next + 1) % self._data.size
        self._count = min(self._count + 1, self._data.size)

    def values(self) -> np.ndarray:
        """The samples, oldest first (a copy)."""
        if self._count < self._data.size:
            return self._data[: self._count].copy()
        return np.concatenate([self._data[self._next :], self._data[: self._next]])

    def newest(self, n: int) -> np.ndarray:
        """The newest `n` samples (fewer when fewer were pushed), newest first."""
        n = min(n, self._count)
        idx = (self._next - 1 - np.arange(n)) % self._data.size
        return self._data[idx]

    @property
    def latest(self) -> float:
        """The newest sample (NaN when empty)."""
        return float(self._data[(self._next - 1) % self._data.size]) if self._count else math.nan

    def clear(self) -> None:
        self._data.fill(np.nan)
        self._next = self._count = 0


class _RefetchTracker:
    """Counts uploads of tiles that had been resident before, from the streamer's upload records.

    A bitmap over the tile id space remembers every tile ever uploaded; a texture's bits are cleared
    when it closes (its ids may be given to the next texture opened).
    """

    def __init__(self) -> None:
        self._seen = np.zeros(0, bool)
        self._ranges: dict[int, tuple[int, int]] = {}  # texture id -> id range it had when seen

    def check(self, streamer: Streamer) -> int:
        """Mark this frame's uploads seen; returns how many had been seen before."""
        capacity = streamer.tile_capacity
        live = {vt.id: (vt.tiles.start, vt.tiles.stop) for vt in streamer.textures}
        for tex, rng in list(self._ranges.items()):
            if live.get(tex) != rng:
                self._seen[rng[0] : rng[1]] = False
                del self._ranges[tex]
        self._ranges.update(live)
        if self._seen.size < capacity:
            self._seen = np.concatenate([self._seen, np.zeros(capacity - self._seen.size, bool)])
        up = streamer.last.uploaded
        if up is None or not len(up.loads):
            return 0
        ids = up.loads.tiles
        count = int(np.count_nonzero(self._seen[ids]))
        self._seen[ids] = True
        return count


CSV_COLUMNS: tuple[str, ...] = tuple(f.name for f in FRAME_FIELDS)


def csv_row(frame: dict[str, Any]) -> list[str]:
    """One frame record as CSV cells (FRAME_FIELDS order); nested objects as JSON, null as empty."""
    cells = []
    for name in CSV_COLUMNS:
        v = frame.get(name)
        cells.append("" if v is None else json.dumps(v, sort_keys=True) if isinstance(v, dict) else str(v))
    return cells


class Telemetry:
    """Records one frame of a `Streamer` per `update()` (or `record()`); see the module docstring.

    Parameters
    ----------
    streamer
        The streamer to observe (render thread only, like the streamer itself).
    history
        Samples kept per graph series (`HISTORY_SERIES`).
    dt
        Fixed frame-clock step in seconds (deterministic rates); None: real time.
    clock
        Real-time source in seconds when `dt` is None (default ``time.perf_counter``).
    rate_window_s
        Upload MB/s and evictions/s are averaged over this much frame-clock time.
    timer_depth
        GPU timer queries in rotation (results are read up to depth - 1 frames late).
    """

    def __init__(
        self,
        streamer: Streamer,
        *,
        history: int = 240,
        dt: float | None = None,
        clock: Callable[[], float] | None = None,
        rate_window_s: float = 0.5,
        timer_depth: int = 4,
    ) -> None:
        if dt is not None and not (isinstance(dt, int | float) and math.isfinite(dt) and dt > 0):
            raise ValueError(f"dt must be a positive number of seconds or None, got {dt!r}")
        if not rate_window_s > 0:
            raise ValueError(f"rate window must be positive, got {rate_window_s!r} s")
        if history < 2:
            raise ValueError(f"history must keep at least 2 frames, got {history!r}")
        if timer_depth < 2:
            raise ValueError(f"timer depth must be >= 2, got {timer_depth!r}")
        self.streamer = streamer
        self.dt = None if dt is None else float(dt)
        self.clock = clock or time.perf_counter
        self.rate_window_s = float(rate_window_s)
        self.timer_depth = timer_depth
        self._histories = {name: History(history) for name in HISTORY_SERIES}
        self._timer: GpuTimer | None = None
        self._timer_failed = False
        self._gpu_results = 0
        self._jsonl: IO[str] | None = None
        self._csv_file: IO[str] | None = None
        self._csv: Any = None  # csv.writer
        self.jsonl_path: Path | None = None
        self._refetch = _RefetchTracker()
        self.last: FrameRecord | None = None
        self._released = False
        self.reset()

    # ---- recording ----------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every recorded frame (histories, run accumulators); the JSONL file stays open."""
        for h in self._histories.values():
            h.clear()
        self.frames = 0
        self._t0 = self.clock()
        self._t_prev = self._t0
        self._time = 0.0
        self._update_ms = array.array("d")
        self._gpu_ms = array.array("d")
        self._latency_hist = np.zeros(_LATENCY_BINS, np.int64)
        self._latency_max = -1
        # cumulative counters now: per-frame figures are differences from these
        base = self.streamer.stats()
        self._prev_totals = self._totals(base)
        self._prev_stalls = base.ring_stalls
        self._prev_dropped = base.feedback_dropped
        self._prev_net_bytes = base.net_bytes
        self._run = {
            "uploads": 0,
            "upload_bytes": 0,
            "requested": 0,
            "evicted": 0,
            "failed": 0,
            "refetched": 0,
            "ring_stalls": 0,
            "feedback_dropped": 0,
            "max_missing": 0,
        }
        self._max_bias = 0.0
        self._total_refetched = 0
        self.last = None

    def update(self) -> FrameRecord:
        """Run `streamer.update()`, timing it, then `record()` the frame; returns the frame record."""
        t = time.perf_counter()
        self.streamer.update()
        return self.record(update_ms=(time.perf_counter() - t) * 1e3)

    def record(self, update_ms: float | None = None) -> FrameRecord:
        """Record the frame the latest `streamer.update()` produced; returns its `FrameRecord`
        (``.as_dict()`` is the JSON record)."""
        t_record = time.perf_counter()
        s = self.streamer.stats()
        if self.dt is not None:
            dt = self.dt
            self._time += dt
        else:
            now = self.clock()
            dt = max(0.0, now - self._t_prev)
            self._t_prev = now
            self._time = now - self._t0
        cur_totals = self._totals(s)
        evicted = cur_totals["evicted"] - self._prev_totals["evicted"]
        self._prev_totals = cur_totals
        stalls = int(s.ring_stalls)
        stalls_frame = stalls - self._prev_stalls
        self._prev_stalls = stalls
        dropped = int(s.feedback_dropped)
        dropped_frame = dropped - self._prev_dropped
        self._prev_dropped = dropped
        uploads = int(s.uploads)
        upload_bytes = int(s.upload_bytes)
        refetched = self._refetch.check(self.streamer) if uploads or self.frames == 0 else 0
        self._total_refetched += refetched
        gpu_ms = self._poll_gpu()
        if update_ms is None:
            update_ms = s.update_ms
        self._record_latencies(s)

        h = self._histories
        h["dt_s"].push(dt)
        h["upload_bytes"].push(upload_bytes)
        h["evicted"].push(evicted)
        net_total = int(s.net_bytes)
        h["net_bytes"].push(max(0, net_total - self._prev_net_bytes))
        self._prev_net_bytes = net_total
        net_mb_s = self._rate("net_bytes") / MB
        upload_mb_s = self._rate("upload_bytes") / MB
        evictions_per_s = self._rate("evicted")
        budget = int(s.budget_bytes)
        vram = int(s.vram_bytes)
        frame: dict[str, Any] = {
            "frame": int(s.frame),
            "time_s": float(self._time),
            "dt_s": float(dt),
            "update_ms": float(update_ms),
            "upload_ms": float(s.upload_ms),
            **{name: float(getattr(self.streamer.last, name)) for name in _PHASES},
            "gpu_ms": gpu_ms,
            "uploads": uploads,
            "upload_bytes": upload_bytes,
            "upload_mb_s": float(upload_mb_s),
            "requested": int(s.requested),
            "wanted_pages": int(s.wanted_pages),
            "missing_pages": int(s.missing_pages),
            "resident_tiles": int(s.resident_tiles),
            "working_set_bytes": int(s.working_set_bytes),
            "stream_cache_bytes": int(s.stream_cache_bytes),
            "in_flight": int(s.in_flight),
            "queued": int(s.queued),
            "evicted": int(evicted),
            "evictions_per_s": float(evictions_per_s),
            "refetched": int(refetched),
            "failed": int(s.failed),
            "corrupt_tiles": int(s.corrupt_tiles),
            "feedback_age": int(s.feedback_age),
            "feedback_dropped": dropped,
            "latency_p50_frames": float(s.latency_p50_frames),
            "latency_p95_frames": float(s.latency_p95_frames),
            "latency_p99_frames": float(s.latency_p99_frames),
            "ring_occupancy": float(s.ring_occupancy),
            "ring_stalls": stalls,
            "ring_stalls_frame": int(stalls_frame),
            "upload_path": str(s.upload_path),
            "vram_bytes": vram,
            "vram_peak_bytes": int(s.vram_peak_bytes),
            "budget_bytes": budget,
            "headroom_bytes": budget - vram,
            "budget_source": str(s.budget_source),
            "vram_breakdown": dict(s.vram_breakdown),
            "mip_bias": float(s.mip_bias),
            **{f"total_{k}": v for k, v in cur_totals.items()},
            "total_refetched": self._total_refetched,
            "remote_packs": int(s.remote_packs),
            "net_mb_s": float(net_mb_s),
            "net_latency_p95_ms": float(s.net_latency_p95_ms),
            "net_failed_requests": int(s.net_failed_requests),
            "net_offline": bool(s.net_offline),
            "total_net_bytes": net_total,
            "cache_hit_rate": float(s.cache_hit_rate),
            "cache_bytes": int(s.cache_bytes),
            "cache_capacity_bytes": int(s.cache_capacity_bytes),
        }
        frame["record_ms"] = (time.perf_counter() - t_record) * 1e3
        assert len(frame) == len(FRAME_FIELDS), "frame record and FRAME_FIELDS disagree"
        for name in (
            "update_ms",
            "uploads",
            "upload_mb_s",
            "evictions_per_s",
            "vram_bytes",
            "mip_bias",
            "missing_pages",
            "in_flight",
            "queued",
            "net_mb_s",
        ):
            h[name].push(frame[name])
        h["gpu_ms"].push(math.nan if gpu_ms is None else gpu_ms)

        self.frames += 1
        self._update_ms.append(frame["update_ms"])
        if gpu_ms is not None:
            self._gpu_ms.append(gpu_ms)
        run = self._run
        run["uploads"] += uploads
        run["upload_bytes"] += upload_bytes
        run["requested"] += frame["requested"]
        run["evicted"] += evicted
        run["failed"] += frame["failed"]
        run["refetched"] += refetched
        run["ring_stalls"] += stalls_frame
        run["feedback_dropped"] += dropped_frame
        run["max_missing"] = max(run["max_missing"], frame["missing_pages"])
        self._max_bias = max(self._max_bias, frame["mip_bias"])
        record = FrameRecord(**frame)
        self.last = record
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(frame, separators=(",", ":"), allow_nan=False) + "\n")
            self._jsonl.flush()
        if self._csv is not None:
            self._csv.writerow(csv_row(frame))
            self._csv_file.flush()
        return record

    @staticmethod
    def _totals(stats: StreamerStats) -> dict[str, int]:
        return {k: int(getattr(stats.totals, k)) for k in _TOTALS}

    def _rate(self, series: str) -> float:
        """Sum of `series` per frame-clock second over the newest `rate_window_s` (at least one frame)."""
        dts = self._histories["dt_s"].newest(self._histories["dt_s"].capacity)
        vals = self._histories[series].newest(dts.size)
        within = np.cumsum(dts) <= self.rate_window_s + 1e-12
        n = max(1, int(np.count_nonzero(within)))
        span = float(dts[:n].sum())
        return float(vals[:n].sum()) / span if span > 0 else 0.0

    def _record_latencies(self, stats: StreamerStats) -> None:
        last = self.streamer.last
        if last.frame != stats.frame:
            return
        a = np.asarray(last.latency_frames, np.int64)
        if a.size:
            self._latency_max = max(self._latency_max, int(a.max()))
            self._latency_hist += np.bincount(np.clip(a, 0, _LATENCY_BINS - 1), minlength=_LATENCY_BINS)

    # ---- GPU time -----------------------------------------------------------------------------
    def gpu_begin(self) -> None:
        """Start timing this frame's GPU work (pair with `gpu_end`); never waits for the GPU."""
        timer = self._gpu_timer()
        if timer is not None:
            timer.begin()

    def gpu_end(self) -> None:
        if self._timer is not None:
            self._timer.end()

    def _gpu_timer(self) -> GpuTimer | None:
        if self._timer is None and not self._timer_failed:
            gl = self.streamer.gl
            if not gl.has(Feature.TIMER_QUERY):
                self._timer_failed = True
                log.info("no GL timer queries on this context: GPU frame times are not measured")
                return None
            self._timer = gl.timer(self.timer_depth)
        return self._timer

    def _poll_gpu(self) -> float | None:
        """The newest GPU time finished since the previous frame record, or None."""
        if self._timer is None:
            return None
        value = self._timer.poll()
        self._timer.last_ms = None  # the next record reports only measurements newer than this one
        if value is None:
            return None
        self._gpu_results += 1
        # The first query of a context can be garbage (Mesa llvmpipe reports ~the time since boot).
        if self._gpu_results == 1 or not 0.0 <= value < MAX_GPU_MS:
            log.debug(
                "GPU time %.3f ms discarded (%s)", value, "first query" if self._gpu_results == 1 else "implausible"
            )
            return None
        return float(value)

    # ---- reading ------------------------------------------------------------------------------
    def history(self, name: str) -> np.ndarray:
        """Recorded values of series `name` (one of `HISTORY_SERIES`), oldest first."""
        try:
            return self._histories[name].values()
        except KeyError:
            raise ValueError(f"unknown history series {name!r}; one of {', '.join(HISTORY_SERIES)}") from None

    @property
    def history_capacity(self) -> int:
        return self._histories["dt_s"].capacity

    def latency_percentiles(self, percentiles: tuple[float, ...] = (50, 95, 99)) -> tuple[float | None, ...]:
        """Request-to-resident latency (frames) over the whole run, nearest rank; None without samples."""
        counts = self._latency_hist
        n = int(counts.sum())
        if n == 0:
            return tuple(None for _ in percentiles)
        cdf = np.cumsum(counts)
        out = []
        for p in percentiles:
            rank = max(1, math.ceil(p / 100.0 * n))
            v = int(np.searchsorted(cdf, rank))
            out.append(float(self._latency_max if v == _LATENCY_BINS - 1 else v))
        return tuple(out)

    def summary(self) -> dict[str, Any]:
        """End-of-run figures (`SUMMARY_SCHEMA`) over every frame recorded since creation or `reset()`."""
        st = self.streamer
        budget = st.budget
        run = self._run
        wall = float(self._time)  # the sum of every recorded frame's dt_s
        upd = np.frombuffer(self._update_ms, np.float64) if self.frames else np.zeros(0)
        gpu = np.frombuffer(self._gpu_ms, np.float64) if len(self._gpu_ms) else np.zeros(0)
        p50, p95, p99 = self.latency_percentiles()
        last = self.last
        out: dict[str, Any] = {
            "frames": self.frames,
            "wall_s": wall,
            "fps_mean": self.frames / wall if wall > 0 else 0.0,
            "textures": len(st.textures),
            "budget_bytes": int(budget.budget),
            "budget_source": str(budget.source),
            "vram_peak_bytes": int(budget.peak),
            "vram_peak_fraction": budget.peak / budget.budget if budget.budget else 0.0,
            "vram_final_bytes": int(budget.usage),
            "uploads": run["uploads"],
            "upload_bytes": run["upload_bytes"],
            "upload_mb_s_mean": run["upload_bytes"] / MB / wall if wall > 0 else 0.0,
            "requested": run["requested"],
            "latency_samples": int(self._latency_hist.sum()),
            "latency_p50_frames": p50,
            "latency_p95_frames": p95,
            "latency_p99_frames": p99,
            "latency_max_frames": float(self._latency_max) if self._latency_max >= 0 else None,
            "update_ms_mean": _stat(upd, np.mean),
            "update_ms_p50": _stat(upd, lambda a: np.percentile(a, 50)),
            "update_ms_p95": _stat(upd, lambda a: np.percentile(a, 95)),
            "update_ms_max": _stat(upd, np.max),
            "gpu_samples": int(gpu.size),
            "gpu_ms_p50": _stat(gpu, lambda a: np.percentile(a, 50)),
            "gpu_ms_p95": _stat(gpu, lambda a: np.percentile(a, 95)),
            "gpu_ms_max": _stat(gpu, np.max),
            "evictions": run["evicted"],
            "refetches": run["refetched"],
            "refetch_fraction": run["refetched"] / run["uploads"] if run["uploads"] else 0.0,
            "failed": run["failed"],
            "corrupt_tiles": int(sum(vt.corrupt_tiles for vt in st.textures)),
            "max_mip_bias": float(self._max_bias),
            "final_mip_bias": float(budget.bias),
            "max_missing_pages": run["max_missing"],
            "final_missing_pages": last.missing_pages if last is not None else 0,
            "ring_stalls": run["ring_stalls"],
            "feedback_dropped": run["feedback_dropped"],
        }
        validate_summary(out)
        return out

    # ---- export -------------------------------------------------------------------------------
    def write_jsonl(self, path: str | os.PathLike[str]) -> Path:
        """Stream every frame recorded from now on to `path`, one JSON object a line (flushed each frame).

        The file is opened once (truncated) and stays open until `close_jsonl()` / `release()`;
        calling this again closes the previous file first.
        """
        self.close_jsonl()
        p = Path(path)
        self._jsonl = p.open("w", encoding="utf-8", newline="\n")
        self.jsonl_path = p
        log.info("telemetry: writing frames to %s", p)
        return p

    def close_jsonl(self) -> None:
        if self._jsonl is not None:
            f, self._jsonl = self._jsonl, None
            f.close()

    def write_csv(self, path: str | os.PathLike[str]) -> Path:
        """Stream every frame recorded from now on to `path` as CSV: a header row of the frame
        fields (FRAME_FIELDS order), then a row a frame; `vram_breakdown` is a JSON object in its
        cell, null is an empty cell. Stays open until `close_csv()` / `release()`."""
        import csv

        self.close_csv()
        p = Path(path)
        self._csv_file = p.open("w", encoding="utf-8", newline="")
        self._csv = csv.writer(self._csv_file)
        self._csv.writerow(CSV_COLUMNS)
        self._csv_file.flush()
        log.info("telemetry: writing frames to %s (CSV)", p)
        return p

    def close_csv(self) -> None:
        if self._csv_file is not None:
            f, self._csv_file, self._csv = self._csv_file, None, None
            f.close()

    def write_summary(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Write `summary()` to `path` as indented JSON (written to a temp file, then renamed)."""
        data = self.summary()
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        os.replace(tmp, p)
        return data

    # ---- lifetime -----------------------------------------------------------------------------
    def release(self) -> None:
        """Close the JSONL file and free the GPU timer queries (idempotent; render thread)."""
        if self._released:
            return
        self._released = True
        self.close_jsonl()
        self.close_csv()
        if self._timer is not None:
            self._timer.release()
            self._timer = None

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _stat(values: np.ndarray, fn: Callable[[np.ndarray], Any]) -> float | None:
    return float(fn(values)) if values.size else None
