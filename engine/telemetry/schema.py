"""The telemetry record formats: one field table each for frames and run summaries.

`FRAME_FIELDS` / `SUMMARY_FIELDS` are the single source of truth: `FRAME_SCHEMA` / `SUMMARY_SCHEMA`
(JSON-Schema-like dicts), `validate_frame` / `validate_summary` and the tables in
docs/TELEMETRY.md (`schema_markdown`) all derive from them. Field names are stable: a field is
never renamed or given another unit; new fields may be added (and documented) in later versions.

Units: bytes are bytes; ``MB/s`` is 10^6 bytes per second of the frame clock; times are the frame
clock (real time, or a fixed ``dt`` for deterministic benchmarks) except ``*_ms`` CPU/GPU timings,
which are always measured.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FRAME_FIELDS",
    "FrameRecord",
    "FRAME_SCHEMA",
    "SUMMARY_FIELDS",
    "SUMMARY_SCHEMA",
    "Field",
    "schema_markdown",
    "validate_frame",
    "validate_summary",
]


@dataclass(frozen=True)
class Field:
    """One record field: its name, JSON type, unit and meaning."""

    name: str
    type: str  # "integer", "number", "string", "boolean", "object" (str -> integer), "|null" when nullable
    unit: str
    meaning: str

    @property
    def json_type(self) -> str | list[str]:
        parts = self.type.split("|")
        return parts[0] if len(parts) == 1 else parts


def _f(name: str, type_: str, unit: str, meaning: str) -> Field:
    return Field(name, type_, unit, meaning)


# fmt: off
FRAME_FIELDS: tuple[Field, ...] = (
    _f("frame", "integer", "frame", "Streamer frame number (`Streamer.frame` after this update)."),
    _f("time_s", "number", "s", "Frame-clock time since the Telemetry started (fixed `dt` x frames in benchmarks)."),
    _f("dt_s", "number", "s", "Frame-clock time since the previous recorded frame."),
    _f("update_ms", "number", "ms", "CPU time of `Streamer.update()` (timed by `Telemetry.update()`; the "
       "streamer's own figure when `record()` is called directly)."),
    _f("upload_ms", "number", "ms", "Part of `update()` spent issuing tile uploads."),
    _f("feedback_ms", "number", "ms", "Part of `update()` closing the frame's feedback buffer, collecting the "
       "signalled ones and opening the next (`FrameStats.feedback_ms`)."),
    _f("reduce_ms", "number", "ms", "Part of `update()` reducing the feedback to wanted pages (with the mip-bias "
       "step and the LRU touch of the pages sampled)."),
    _f("drain_ms", "number", "ms", "Part of `update()` taking the I/O threads' finished reads."),
    _f("select_ms", "number", "ms", "Part of `update()` choosing this frame's loads (dedup against resident and "
       "in-flight tiles, order, caps)."),
    _f("reserve_ms", "number", "ms", "Part of `update()` reserving cache slots for the loads (evictions)."),
    _f("submit_ms", "number", "ms", "Part of `update()` handing the loads to the I/O threads."),
    _f("page_table_ms", "number", "ms", "Part of `update()` uploading changed page-table entries."),
    _f("stats_ms", "number", "ms", "Part of `update()` counting this frame's figures (missing pages)."),
    _f("record_ms", "number", "ms", "Time `Telemetry` took to build this record (outside `update()`)."),
    _f("gpu_ms", "number|null", "ms", "Newest finished GPU time of the draw bracketed by `gpu_begin()`/`gpu_end()`; "
       "read without waiting, so up to `timer_depth - 1` (3) frames old; null when none finished since the "
       "previous record."),
    _f("uploads", "integer", "tiles", "Tiles uploaded into the cache this frame."),
    _f("upload_bytes", "integer", "bytes", "Bytes uploaded this frame."),
    _f("upload_mb_s", "number", "MB/s", "Upload rate over the last `rate_window_s` of the frame clock (10^6 B/s)."),
    _f("requested", "integer", "tiles", "Loads handed to the I/O threads this frame."),
    _f("wanted_pages", "integer", "pages", "Distinct pages the newest feedback asked for (after the mip bias)."),
    _f("missing_pages", "integer", "pages", "Wanted pages not resident at their wanted level."),
    _f("resident_tiles", "integer", "tiles", "Tiles resident in the cache, every open texture."),
    _f("working_set_bytes", "integer", "bytes", "GPU bytes of the tiles the newest feedback wants at full detail "
       "(before the mip bias), with their parents (trilinear samples both); coarsest pinned levels excluded."),
    _f("stream_cache_bytes", "integer", "bytes", "GPU bytes of the cache slots streamed tiles can use (every pool, "
       "less the slots pinned for coarsest levels). `working_set_bytes` above this is budget pressure: the mip "
       "bias rises."),
    _f("in_flight", "integer", "tiles", "Loads being read by the I/O threads."),
    _f("queued", "integer", "tiles", "Requests waiting in the scheduler (the I/O queue depth)."),
    _f("evicted", "integer", "tiles", "Tiles evicted this frame."),
    _f("evictions_per_s", "number", "1/s", "Eviction rate over the last `rate_window_s` of the frame clock."),
    _f("refetched", "integer", "tiles", "Uploads this frame of tiles that had been resident before (evicted, "
       "then loaded again)."),
    _f("failed", "integer", "tiles", "Loads that failed this frame (corrupt, truncated or unreadable tiles)."),
    _f("corrupt_tiles", "integer", "tiles", "Distinct tiles whose load failed so far (corrupt, truncated, "
       "unreadable, hung), over the open textures."),
    _f("feedback_age", "integer", "frames", "Frames between the newest feedback read and the frame it was "
       "drawn in; -1 before the first."),
    _f("feedback_dropped", "integer", "entries", "Feedback entries lost to a full feedback buffer so far."),
    _f("latency_p50_frames", "number", "frames", "Median request-to-resident latency of recent uploads (the "
       "streamer's window of the last 4096)."),
    _f("latency_p95_frames", "number", "frames", "95th percentile of the same latencies."),
    _f("latency_p99_frames", "number", "frames", "99th percentile of the same latencies."),
    _f("ring_occupancy", "number", "fraction", "Staging-ring slots not free (0..1)."),
    _f("ring_stalls", "integer", "count", "Staging-ring acquires that found no free slot so far."),
    _f("ring_stalls_frame", "integer", "count", "Staging-ring stalls this frame."),
    _f("upload_path", "string", "", "Where the uploads read from: `host-ring`, `device-buffer` or `staging-texture` "
       "(`StreamerConfig.upload_path`; empty before the first texture opens)."),
    _f("vram_bytes", "integer", "bytes", "Engine GPU memory held (every allocation registered with the budget)."),
    _f("vram_peak_bytes", "integer", "bytes", "Highest engine GPU memory held so far."),
    _f("budget_bytes", "integer", "bytes", "The VRAM budget."),
    _f("headroom_bytes", "integer", "bytes", "Budget left: `budget_bytes - vram_bytes`."),
    _f("budget_source", "string", "", "Where the budget came from: config, driver, fallback or runtime."),
    _f("vram_breakdown", "object", "bytes", "Bytes per allocation name (`pool/...`, `page-table/N`, "
       "`staging-ring`, `staging-device`, `feedback`), largest first."),
    _f("mip_bias", "number", "levels", "Feedback mip bias the budget controller applies (0 = full detail)."),
    _f("total_uploads", "integer", "tiles", "Tiles uploaded since the streamer started."),
    _f("total_upload_bytes", "integer", "bytes", "Bytes uploaded since the streamer started."),
    _f("total_evicted", "integer", "tiles", "Tiles evicted since the streamer started."),
    _f("total_failed", "integer", "tiles", "Failed loads since the streamer started."),
    _f("total_requested", "integer", "tiles", "Loads issued since the streamer started."),
    _f("total_cancelled", "integer", "tiles", "Queued requests cancelled (no longer wanted) since the streamer "
       "started."),
    _f("total_refetched", "integer", "tiles", "Re-fetches since the Telemetry started (or `reset()`)."),
    _f("remote_packs", "integer", "count", "Open textures read by URL (http(s):// or an fsspec filesystem)."),
    _f("net_mb_s", "number", "MB/s", "Bytes received from remote packs' servers over the last `rate_window_s` "
       "(10^6 B/s)."),
    _f("net_latency_p95_ms", "number", "ms", "95th percentile time of the open remote packs' recent range "
       "requests (the last 512 of each); 0 without any."),
    _f("net_failed_requests", "integer", "count", "Range requests that failed since the streamer started "
       "(each try counts, retries included)."),
    _f("net_offline", "boolean", "", "A remote pack's server could not be reached a moment ago: its requests "
       "fail at once for `RemoteConfig.offline_s`, then one probes again."),
    _f("total_net_bytes", "integer", "bytes", "Bytes received from remote packs' servers since the streamer "
       "started."),
    _f("cache_hit_rate", "number", "fraction", "Blocks of remote packs found in the disk cache over blocks "
       "needed, since the streamer started (0 before any)."),
    _f("cache_bytes", "integer", "bytes", "Bytes held by the remote-pack disk cache (shared by every remote "
       "pack; it persists between runs)."),
    _f("cache_capacity_bytes", "integer", "bytes", "The disk cache's bound (`RemoteConfig.cache_mb`); 0 when "
       "no remote pack is open or the cache is off."),
)

SUMMARY_FIELDS: tuple[Field, ...] = (
    _f("frames", "integer", "frames", "Frames recorded."),
    _f("wall_s", "number", "s", "Frame-clock time the recorded frames cover (sum of `dt_s`)."),
    _f("fps_mean", "number", "1/s", "`frames / wall_s` (0 when no time passed)."),
    _f("textures", "integer", "count", "Virtual textures open at the end."),
    _f("budget_bytes", "integer", "bytes", "The VRAM budget at the end."),
    _f("budget_source", "string", "", "Where the budget came from: config, driver, fallback or runtime."),
    _f("vram_peak_bytes", "integer", "bytes", "Highest engine GPU memory held (the budget manager's peak)."),
    _f("vram_peak_fraction", "number", "fraction", "`vram_peak_bytes / budget_bytes`; <= 1 by the budget invariant."),
    _f("vram_final_bytes", "integer", "bytes", "Engine GPU memory held at the end."),
    _f("uploads", "integer", "tiles", "Tiles uploaded during the recorded frames."),
    _f("upload_bytes", "integer", "bytes", "Bytes uploaded during the recorded frames."),
    _f("upload_mb_s_mean", "number", "MB/s", "`upload_bytes / wall_s` (10^6 B/s)."),
    _f("requested", "integer", "tiles", "Loads issued during the recorded frames."),
    _f("latency_samples", "integer", "tiles", "Uploads whose request-to-resident latency was measured."),
    _f("latency_p50_frames", "number|null", "frames", "Median request-to-resident latency over the whole run "
       "(nearest rank); null without samples."),
    _f("latency_p95_frames", "number|null", "frames", "95th percentile of the same."),
    _f("latency_p99_frames", "number|null", "frames", "99th percentile of the same."),
    _f("latency_max_frames", "number|null", "frames", "Longest latency seen."),
    _f("update_ms_mean", "number|null", "ms", "Mean CPU time of `update()`; null without frames."),
    _f("update_ms_p50", "number|null", "ms", "Median CPU time of `update()`."),
    _f("update_ms_p95", "number|null", "ms", "95th percentile CPU time of `update()`."),
    _f("update_ms_max", "number|null", "ms", "Longest `update()`."),
    _f("gpu_samples", "integer", "frames", "GPU frame times measured."),
    _f("gpu_ms_p50", "number|null", "ms", "Median GPU frame time; null without measurements."),
    _f("gpu_ms_p95", "number|null", "ms", "95th percentile GPU frame time."),
    _f("gpu_ms_max", "number|null", "ms", "Longest GPU frame time measured."),
    _f("evictions", "integer", "tiles", "Tiles evicted during the recorded frames."),
    _f("refetches", "integer", "tiles", "Uploads of tiles that had been resident before (evicted, then "
       "loaded again): the cost of a budget too small for the working set."),
    _f("refetch_fraction", "number", "fraction", "`refetches / uploads` (0 without uploads)."),
    _f("failed", "integer", "tiles", "Failed loads during the recorded frames."),
    _f("corrupt_tiles", "integer", "tiles", "Distinct tiles whose load failed, over the textures open at the end."),
    _f("max_mip_bias", "number", "levels", "Highest feedback mip bias during the recorded frames."),
    _f("final_mip_bias", "number", "levels", "Feedback mip bias at the end."),
    _f("max_missing_pages", "integer", "pages", "Most wanted-but-missing pages in one frame."),
    _f("final_missing_pages", "integer", "pages", "Wanted-but-missing pages in the last frame (0 = converged)."),
    _f("ring_stalls", "integer", "count", "Staging-ring stalls during the recorded frames."),
    _f("feedback_dropped", "integer", "entries", "Feedback entries lost during the recorded frames."),
)
# fmt: on


def _schema(title: str, fields: tuple[Field, ...]) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for f in fields:
        prop: dict[str, Any] = {"type": f.json_type, "unit": f.unit, "description": f.meaning}
        if f.type == "object":
            prop["additionalProperties"] = {"type": "integer"}
        props[f.name] = prop
    return {
        "title": title,
        "type": "object",
        "required": [f.name for f in fields],
        "additionalProperties": False,
        "properties": props,
    }


FRAME_SCHEMA: dict[str, Any] = _schema("texstream telemetry frame", FRAME_FIELDS)

_PYTHON_TYPES: dict[str, Any] = {"integer": int, "number": float, "string": str, "boolean": bool, "object": dict}


def _record_type(name: str, fields: tuple[Field, ...], doc: str) -> type:
    """A frozen dataclass with one typed attribute per field, in the table's order."""
    spec = []
    for f in fields:
        base = _PYTHON_TYPES[f.type.split("|")[0]]
        spec.append((f.name, base | None if f.type.endswith("|null") else base))

    def as_dict(self: Any) -> dict[str, Any]:
        """The record as the JSON object `FRAME_SCHEMA` describes (field order kept)."""
        return {f.name: getattr(self, f.name) for f in fields}

    cls = dataclasses.make_dataclass(name, spec, frozen=True, slots=True, namespace={"as_dict": as_dict})
    cls.__doc__ = doc
    cls.__module__ = __name__
    return cls


FrameRecord = _record_type(
    "FrameRecord",
    FRAME_FIELDS,
    """One frame as `Telemetry` records it: an attribute per `FRAME_FIELDS` entry (same names, units
    and meaning as the JSONL export, which is ``record.as_dict()``).""",
)
SUMMARY_SCHEMA: dict[str, Any] = _schema("texstream telemetry summary", SUMMARY_FIELDS)


def _type_ok(value: object, type_name: str) -> bool:
    if type_name == "null":
        return value is None
    if type_name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if type_name == "string":
        return isinstance(value, str)
    if type_name == "boolean":
        return isinstance(value, bool)
    if type_name == "object":
        return isinstance(value, Mapping)
    raise AssertionError(f"unknown schema type {type_name!r}")


def _validate(record: Mapping[str, Any], schema: Mapping[str, Any], what: str) -> list[str]:
    if not isinstance(record, Mapping):
        raise TypeError(f"{what} must be a mapping, got {type(record).__name__}")
    problems: list[str] = []
    props = schema["properties"]
    for name in schema["required"]:
        if name not in record:
            problems.append(f"missing field {name!r}")
    for name, value in record.items():
        prop = props.get(name)
        if prop is None:
            problems.append(f"unknown field {name!r}")
            continue
        types = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
        if not any(_type_ok(value, t) for t in types):
            problems.append(f"field {name!r} = {value!r} is not {' or '.join(types)}")
            continue
        extra = prop.get("additionalProperties")
        if isinstance(extra, dict) and isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str) or not _type_ok(item, extra["type"]):
                    problems.append(f"field {name!r}[{key!r}] = {item!r} is not {extra['type']}")
    return problems


def validate_frame(record: Mapping[str, Any] | FrameRecord) -> None:
    """Raise ValueError listing every way `record` departs from `FRAME_SCHEMA` (no-op when it fits)."""
    if isinstance(record, FrameRecord):
        record = record.as_dict()
    problems = _validate(record, FRAME_SCHEMA, "frame record")
    if problems:
        raise ValueError("frame record does not fit FRAME_SCHEMA: " + "; ".join(problems))


def validate_summary(record: Mapping[str, Any]) -> None:
    """Raise ValueError listing every way `record` departs from `SUMMARY_SCHEMA` (no-op when it fits)."""
    problems = _validate(record, SUMMARY_SCHEMA, "summary")
    if problems:
        raise ValueError("summary does not fit SUMMARY_SCHEMA: " + "; ".join(problems))


def schema_markdown(fields: tuple[Field, ...]) -> str:
    """A Markdown table of `fields` (name, type, unit, meaning), as in docs/TELEMETRY.md."""
    rows = ["| name | type | unit | meaning |", "|---|---|---|---|"]
    for f in fields:
        kind = f.type.replace("|", " or ")
        rows.append(f"| `{f.name}` | {kind} | {f.unit or '-'} | {f.meaning.replace('|', '/')} |")
    return "\n".join(rows)
