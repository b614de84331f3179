"""Telemetry of real headless streaming runs: frame records, JSONL, summary, re-fetches, GPU time, and
the GPU memory summary."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import moderngl
import numpy as np
import pytest

from texstream.apps.render import PlaneRenderer
from texstream.runtime.streamer import Streamer
from texstream.scene.camera import View
from texstream.telemetry import SUMMARY_SCHEMA, Telemetry, memory_stats, memory_summary, validate_frame
from texstream.telemetry.stats import MB

from .conftest import Packs, streamer_config

pytestmark = pytest.mark.gl

DT = 1 / 60
VIEWS = [View(0.5, 0.5, 2.0), View(0.3, 0.6, 1.0), View(0.5, 0.5, 0.5)]
SETTLE_FRAMES = 600


def run(telemetry: Telemetry, renderer: PlaneRenderer, vt, frames: int, view: View | None = None) -> list[dict]:  # noqa: ANN001
    out = []
    for i in range(frames):
        out.append(telemetry.update())
        telemetry.gpu_begin()
        renderer.draw(vt, view or VIEWS[i * len(VIEWS) // frames])
        telemetry.gpu_end()
    return out


def test_frames_fit_the_schema_and_stream_to_jsonl(
    gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer, tmp_path: Path
) -> None:
    path = tmp_path / "frames.jsonl"
    with Streamer(gl_context, streamer_config()) as streamer, Telemetry(streamer, dt=DT) as tel:
        vt = streamer.open(packs.small)
        assert tel.write_jsonl(path) == path
        frames = run(tel, renderer, vt, 6)
        lines = path.read_text().splitlines()  # flushed every frame: readable while open
        assert len(lines) == 6
        frames += run(tel, renderer, vt, 12)
        # The loads are asynchronous: on a busy machine the last view may still miss pages after
        # its four frames, so it keeps drawing (bounded) until nothing is missing.
        while frames[-1].missing_pages and len(frames) < SETTLE_FRAMES:
            frames += run(tel, renderer, vt, 1, view=VIEWS[-1])
    for f in frames:
        validate_frame(f)
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [f.as_dict() for f in frames]
    assert [f.frame for f in frames] == list(range(1, len(frames) + 1))
    assert sum(f.uploads for f in frames) > 0, "the run streamed tiles"
    assert any(f.missing_pages for f in frames) and frames[-1].missing_pages == 0
    last = frames[-1]
    assert last.time_s == pytest.approx(len(frames) * DT) and last.dt_s == pytest.approx(DT)
    assert last.headroom_bytes == last.budget_bytes - last.vram_bytes >= 0
    assert sum(last.vram_breakdown.values()) == last.vram_bytes
    assert last.total_uploads == sum(f.uploads for f in frames)
    assert tel._jsonl is None, "release() closed the file"  # noqa: SLF001


def test_summary_has_every_field_and_adds_up(
    gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer, tmp_path: Path
) -> None:
    with Streamer(gl_context, streamer_config()) as streamer, Telemetry(streamer, dt=DT) as tel:
        vt = streamer.open(packs.small)
        frames = run(tel, renderer, vt, 20)
        written = tel.write_summary(tmp_path / "summary.json")
        s = tel.summary()
    assert json.loads((tmp_path / "summary.json").read_text()) == written == s
    assert list(s) == SUMMARY_SCHEMA["required"]
    assert s["frames"] == 20 and s["wall_s"] == pytest.approx(20 * DT) and s["fps_mean"] == pytest.approx(60)
    assert s["uploads"] == sum(f.uploads for f in frames) > 0
    assert s["upload_bytes"] == sum(f.upload_bytes for f in frames)
    assert s["upload_mb_s_mean"] == pytest.approx(s["upload_bytes"] / MB / s["wall_s"])
    assert s["evictions"] == sum(f.evicted for f in frames)
    assert s["latency_samples"] == s["uploads"]
    assert 0 <= s["latency_p50_frames"] <= s["latency_p95_frames"] <= s["latency_p99_frames"]
    assert s["latency_p99_frames"] <= s["latency_max_frames"]
    upd = [f.update_ms for f in frames]
    assert s["update_ms_max"] == pytest.approx(max(upd))
    assert s["update_ms_p50"] == pytest.approx(float(np.percentile(upd, 50)))
    assert s["vram_peak_bytes"] <= s["budget_bytes"] and s["vram_peak_fraction"] <= 1.0
    assert s["max_missing_pages"] == max(f.missing_pages for f in frames)
    assert s["final_missing_pages"] == frames[-1].missing_pages
    assert s["corrupt_tiles"] == 0 and s["failed"] == 0 and s["textures"] == 1


def test_rates_follow_the_frame_clock(gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer) -> None:
    """With a fixed dt, upload MB/s is the bytes of the newest frames inside the window over their time."""
    window = 0.1  # 6 frames at 60 Hz
    with Streamer(gl_context, streamer_config()) as streamer, Telemetry(streamer, dt=DT, rate_window_s=window) as tel:
        vt = streamer.open(packs.small)
        frames = run(tel, renderer, vt, 12)
    n = round(window / DT)
    for i, f in enumerate(frames):
        recent = frames[max(0, i - n + 1) : i + 1]
        expect = sum(r.upload_bytes for r in recent) / (len(recent) * DT) / MB
        assert f.upload_mb_s == pytest.approx(expect), i
        assert f.evictions_per_s == pytest.approx(sum(r.evicted for r in recent) / (len(recent) * DT))
    np.testing.assert_allclose(tel.history("upload_mb_s"), [f.upload_mb_s for f in frames])
    with pytest.raises(ValueError, match="unknown history series"):
        tel.history("nope")


def test_real_clock_and_direct_record(gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer) -> None:
    ticks = iter(np.arange(0.0, 10.0, 0.02))
    with Streamer(gl_context, streamer_config()) as streamer, Telemetry(streamer, clock=lambda: next(ticks)) as tel:
        vt = streamer.open(packs.small)
        for _ in range(5):
            streamer.update()
            f = tel.record()  # the loop calls update() itself
            renderer.draw(vt, VIEWS[0])
        assert f.update_ms == streamer.stats().update_ms
        assert f.dt_s == pytest.approx(0.02) and f.time_s == pytest.approx(0.1)
        assert f.gpu_ms is None, "no GPU bracket, no GPU time"
    with pytest.raises(ValueError, match="dt"):
        Telemetry(streamer, dt=0)


def test_gpu_time_is_measured_without_waiting(
    gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer
) -> None:
    with Streamer(gl_context, streamer_config()) as streamer, Telemetry(streamer, dt=DT) as tel:
        vt = streamer.open(packs.small)
        frames = run(tel, renderer, vt, 12)
        s = tel.summary()
    gpu = [f.gpu_ms for f in frames if f.gpu_ms is not None]
    assert gpu and s["gpu_samples"] == len(gpu)
    assert all(0 <= g < 10_000 for g in gpu)
    assert s["gpu_ms_max"] == pytest.approx(max(gpu))
    hist = tel.history("gpu_ms")
    assert np.count_nonzero(np.isfinite(hist)) == len(gpu)


def test_refetches_match_an_independent_count(gl_context: moderngl.Context, packs: Packs) -> None:
    """Alternate two far-apart views under a budget that holds one: tiles evicted and loaded again are
    re-fetches; checked against the page tables' resident sets frame by frame."""
    renderer = PlaneRenderer(gl_context, (512, 512))
    views = [View(0.25, 0.25, 1.0), View(0.75, 0.75, 1.0)]
    cfg = streamer_config(budget_mb=1.0, feedback_divisor=16, ring_mb=1, prefetch=False)
    try:
        with Streamer(gl_context, cfg) as streamer, Telemetry(streamer, dt=DT) as tel:
            vt = streamer.open(packs.medium)
            seen: set[tuple[int, int, int]] = set()
            prev: set[tuple[int, int, int]] = set()
            expected = 0
            frames = []
            for i in range(48):
                frames.append(tel.update())
                lv, x, y, _slot = vt.table.resident_tiles()
                now = set(zip(lv.tolist(), x.tolist(), y.tolist(), strict=True))
                new = now - prev
                expected += len(new & seen)
                seen |= now
                prev = now
                renderer.draw(vt, views[(i // 8) % 2])
            s = tel.summary()
    finally:
        renderer.release()
    assert s["evictions"] > 0, "the budget forced evictions"
    assert s["refetches"] == expected > 0
    assert frames[-1].total_refetched == expected == sum(f.refetched for f in frames)
    assert s["refetch_fraction"] == pytest.approx(expected / s["uploads"])


def test_memory_summary_lists_pools_textures_and_totals(gl_context: moderngl.Context, packs: Packs) -> None:
    with Streamer(gl_context, streamer_config()) as streamer:
        a = streamer.open(packs.small)
        b = streamer.open(packs.normals)
        streamer.update()
        text = memory_summary(streamer)
        stats = memory_stats(streamer)
        usage = streamer.budget.usage
        pools = [p.name for p in streamer.pools.values()]
        budget = streamer.budget.budget
        pt_bytes = {vt.id: vt.table.bytes_on_gpu for vt in (a, b)}
    assert len(pools) == 2
    for name in pools:
        assert name in text
    for path in (packs.small, packs.normals):
        assert str(path) in text
    for name in ("staging-ring", "feedback", "Headroom", "Mip bias", "Budget (config)"):
        assert name in text
    m = re.search(r"Total held = (\d+) bytes of a (\d+)-byte budget", text)
    assert m is not None and int(m.group(1)) == usage and int(m.group(2)) == budget
    rows = sum(p["bytes"] for p in stats["pools"]) + sum(t["page_table_bytes"] for t in stats["textures"])
    rows += sum(o["bytes"] for o in stats["other"].values())
    assert rows == stats["total_bytes"] == stats["usage_bytes"] == usage
    assert stats["headroom_bytes"] == budget - usage
    for t in stats["textures"]:
        assert t["page_table_bytes"] == pt_bytes[t["id"]]
        assert sum(t["resident_by_level"]) >= 1 and len(t["resident_by_level"]) == t["levels"]
        assert t["resident_by_level"][-1] == t["tiles_by_level"][-1] == 1, "the coarsest level is pinned"
    for p in stats["pools"]:
        assert p["capacity"] >= p["used"] >= p["resident"] >= p["pinned"] > 0
    assert "unaccounted" not in text and not math.isnan(stats["mip_bias"])


def test_memory_summary_works_as_a_method(gl_context: moderngl.Context) -> None:
    with Streamer(gl_context, streamer_config()) as streamer:
        streamer.memory_summary = memory_summary.__get__(streamer)  # what `Streamer.memory_summary = ...` gives
        text = streamer.memory_summary()
    assert "(none)" in text and "Total held" in text


def test_frames_stream_to_csv(
    gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer, tmp_path: Path
) -> None:
    import csv

    from texstream.telemetry.stats import CSV_COLUMNS

    path = tmp_path / "frames.csv"
    with Streamer(gl_context, streamer_config()) as streamer, Telemetry(streamer, dt=DT) as tel:
        vt = streamer.open(packs.small)
        tel.write_csv(path)
        frames = run(tel, renderer, vt, 8)
        assert len(path.read_text().splitlines()) == 9  # header + one flushed row a frame, while open
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0].keys()) == CSV_COLUMNS
    assert len(rows) == len(frames)
    for row, frame in zip(rows, frames, strict=True):
        assert int(row["frame"]) == frame.frame
        assert int(row["vram_bytes"]) == frame.vram_bytes <= int(row["budget_bytes"])
        assert float(row["update_ms"]) == pytest.approx(frame.update_ms)
        assert json.loads(row["vram_breakdown"]) == frame.vram_breakdown
        assert (row["gpu_ms"] == "") == (frame.gpu_ms is None)
    assert tel._csv_file is None, "release() closed the file"  # noqa: SLF001


def test_working_set_is_the_wanted_tiles_and_their_parents(
    gl_context: moderngl.Context, packs: Packs, renderer: PlaneRenderer
) -> None:
    """A 1:1 top view of the 256 x 256 texels around the centre of a 1024^2 pack (64-texel tiles)
    wants 4 x 4 level-0 tiles; their parents are 2 x 2 tiles of level 1; levels 3 and 4 are pinned.
    So the working set is 20 slots, whatever the budget; the stream cache is every unpinned slot."""
    view = View(0.5, 0.5, 1.0)
    with Streamer(gl_context, streamer_config()) as streamer, Telemetry(streamer, dt=DT) as tel:
        vt = streamer.open(packs.medium)
        frames = []
        for _ in range(8):
            frames.append(tel.update())
            renderer.draw(vt, view)
        (pool,) = streamer.pools.values()
        slot = pool.geometry.slot_bytes
        levels = vt.header.level_table[-streamer.config.pinned_levels :]
        pinned = int((levels["tiles_x"].astype(int) * levels["tiles_y"]).sum())  # the coarsest levels stay
    assert frames[0].working_set_bytes == 0  # no feedback read yet
    assert frames[-1].working_set_bytes == 20 * slot
    assert frames[-1].stream_cache_bytes == (pool.capacity - pinned) * slot
    assert frames[-1].stream_cache_bytes < frames[-1].vram_breakdown[pool.name]


def test_working_set_above_the_cache_raises_the_bias(gl_context: moderngl.Context, packs: Packs) -> None:
    """A minified oblique view of the whole texture through a budget whose cache is smaller than it:
    the working set reads above the cache, and that is when the mip bias rises."""
    renderer = PlaneRenderer(gl_context, (640, 640))
    try:
        with Streamer(gl_context, streamer_config(3.0, ring_mb=1)) as streamer, Telemetry(streamer, dt=DT) as tel:
            vt = streamer.open(packs.medium)
            frames = []
            for _ in range(30):
                frames.append(tel.update())
                renderer.draw(vt, View(0.5, 0.5, 1.2, 50.0))
    finally:
        renderer.release()
    over = [f for f in frames if f.working_set_bytes > f.stream_cache_bytes]
    assert over, [(f.working_set_bytes, f.stream_cache_bytes) for f in frames]
    assert max(f.mip_bias for f in frames) > 0
