"""`texstream bench stream` (b), (b') and (d): the pan over a pack at 1:1 that streams every frame (drawn,
drawn over resident windows, and with CPU-written feedback), and the helpers the stream and remote
benches share (the pan's configuration, the frame throttle, percentiles)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import moderngl
import numpy as np

from ..config import BudgetConfig, StreamerConfig, UploadPath
from ..pack.reader import PackReader
from ..units import MIB

__all__ = ["THROTTLE", "drawn_resident", "end_to_end", "pan_config", "percentile", "streamer_bound"]

# Frames queued on the GPU at most, as a double-buffered window's swap chain allows: headless loops have
# no swap chain to stop the CPU from queueing hundreds of frames (and every fenced readback with them).
THROTTLE = 2


def _warm_page_cache(path: Path) -> None:
    with path.open("rb", buffering=0) as f:
        while f.read(16 * MIB):
            pass


def _budget_mb(packs: list[Path], fixed_mb: float = 96.0) -> float:
    total = 0
    for p in packs:
        with PackReader(p) as r:
            total += r.header.tile_count * r.header.tile_raw_size
    return fixed_mb + 1.25 * total / MIB


def _serpentine(xs: np.ndarray, ys: np.ndarray, max_frames: int) -> list[tuple[float, float]]:
    """Row by row, alternating direction: each step shows a window never seen before."""
    return [(x, y) for j, y in enumerate(ys) for x in (xs if j % 2 == 0 else xs[::-1])][:max_frames]


def pan_config(pack: Path, native: bool = True, upload_path: UploadPath = UploadPath.AUTO) -> StreamerConfig:
    """Budget for the whole pack, a 64 MiB ring, an I/O thread a core, caps that never bind."""
    return StreamerConfig(
        budget=BudgetConfig(budget_mb=_budget_mb([pack])),
        ring_mb=64,
        io_threads=max(2, os.cpu_count() or 2),
        upload_tiles_per_frame=8192,
        upload_bytes_per_frame=1 << 30,
        upload_path=upload_path,
        native=native,
    )


def percentile(values: list[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(np.asarray(values, float), q)) if len(values) else 0.0


# ---- (b) end to end and (d) latency ----------------------------------------------------------------
def end_to_end(
    ctx: moderngl.Context,
    pack: Path,
    size: tuple[int, int],
    max_frames: int,
    native: bool,
    upload_path: UploadPath = UploadPath.AUTO,
) -> dict:
    """The streamer's tiles/s on a boustrophedon pan at 1:1 moving a whole frame per frame (each frame
    shows only tiles never seen before: demand stays above what can be delivered)."""
    from ..runtime.streamer import Streamer
    from ..scene.camera import View
    from .render import PlaneRenderer

    _warm_page_cache(pack)
    with PackReader(pack) as r:
        tex_w, tex_h = r.header.width, r.header.height
    w, h = size
    path = _serpentine(np.arange(w / 2, tex_w - w / 2 + 1, w), np.arange(h / 2, tex_h - h / 2 + 1, h), max_frames)
    cfg = pan_config(pack, native, upload_path)
    renderer = PlaneRenderer(ctx, size)
    latencies: list[np.ndarray] = []
    update_ms, cpu_ms, up_ms, backlog = [], [], [], []
    read_s = batches = 0.0
    try:
        with Streamer(ctx, cfg) as s:
            vt = s.open(pack)
            throttle = s.gl.throttle(THROTTLE)
            s.update()
            renderer.draw(vt, View(path[0][0] / tex_w, path[0][1] / tex_h, 1.0))
            ctx.finish()
            start = s.stats().totals
            t0 = time.perf_counter()
            for x, y in path:
                st = s.update()
                renderer.draw(vt, View(x / tex_w, y / tex_h, 1.0))
                throttle.frame_done()
                latencies.append(st.latency_frames)
                update_ms.append(st.update_ms)
                cpu_ms.append(st.update_cpu_ms)
                up_ms.append(st.upload_ms)
                backlog.append(st.in_flight)
                read_s += st.read_seconds
                batches += st.read_batches
            ctx.finish()
            seconds = time.perf_counter() - t0
            tiles = s.stats().totals.uploads - start.uploads
            nbytes = s.stats().totals.upload_bytes - start.upload_bytes
            native_used = s.io_status().compiled
            path_used = s.io_status().upload_path
            throttle.release()
    finally:
        renderer.release()
    lat = np.concatenate(latencies) if latencies else np.zeros(1)
    return {
        "pack": pack.name,
        "frame_size": list(size),
        "frames": len(path),
        "tiles": tiles,
        "seconds": seconds,
        "tiles_per_s": tiles / seconds,
        "mib_per_s": nbytes / seconds / MIB,
        "fps": len(path) / seconds,
        "compiled": native_used,
        "upload_path": path_used.value if path_used is not None else None,
        "io_threads": cfg.io_threads,
        "update_ms_p50": percentile(update_ms, 50),
        "update_cpu_ms_p50": percentile(cpu_ms, 50),
        "update_cpu_us_per_tile": sum(cpu_ms) * 1e3 / max(1, tiles),  # the whole update(), per tile uploaded
        "upload_cpu_us_per_tile": sum(up_ms) * 1e3 / max(1, tiles),  # the upload step alone (wall)
        "read_us_per_tile": read_s / max(1, tiles) * 1e6 * cfg.io_threads,  # thread-seconds per tile
        "read_batches": int(batches),
        "backlog_mean": float(np.mean(backlog)),
        "latency_frames_p50": percentile(lat, 50),
        "latency_frames_p95": percentile(lat, 95),
        "latency_samples": int(lat.size),
    }


def drawn_resident(ctx: moderngl.Context, pack: Path, size: tuple[int, int], frames: int) -> dict:
    """(b)'s drawing alone: the same plane drawn at 1:1 over four windows of the pan, cycled once every
    tile they sample is resident (update() runs each frame with nothing to stream). Its frame rate times
    (b)'s uploads a frame is what (b) could reach if streaming cost nothing: the drawing's bound."""
    from ..runtime.streamer import Streamer
    from ..scene.camera import View
    from .render import PlaneRenderer

    _warm_page_cache(pack)
    with PackReader(pack) as r:
        tex_w, tex_h = r.header.width, r.header.height
    w, h = size
    views = [View(x / tex_w, y / tex_h, 1.0) for x, y in _serpentine(np.arange(w / 2, 2.5 * w, w), [h / 2, 1.5 * h], 4)]
    renderer = PlaneRenderer(ctx, size)
    try:
        with Streamer(ctx, pan_config(pack)) as s:
            vt = s.open(pack)
            throttle = s.gl.throttle(THROTTLE)
            settled = 0
            for i in range(2000):  # until a whole cycle wants nothing missing and nothing is in flight
                st = s.update()
                renderer.draw(vt, views[i % 4])
                throttle.frame_done()
                settled = settled + 1 if st.missing_pages == 0 and not s.busy and st.uploads == 0 else 0
                if settled >= 8:
                    break
            ctx.finish()
            t0 = time.perf_counter()
            uploads = s.stats().totals.uploads
            for i in range(frames):
                s.update()
                renderer.draw(vt, views[i % 4])
                throttle.frame_done()
            ctx.finish()
            seconds = time.perf_counter() - t0
            uploaded = s.stats().totals.uploads - uploads
            gpu_ms = []  # the draw's own GPU time, after the timed frames (reading a query waits for it)
            query = ctx.query(time=True)
            for i in range(16):
                s.update()
                with query:
                    renderer.draw(vt, views[i % 4])
                gpu_ms.append(query.elapsed / 1e6)
            throttle.release()
    finally:
        renderer.release()
    return {
        "frame_size": list(size),
        "frames": frames,
        "fps": frames / seconds,
        "uploads": uploaded,
        "settled": settled >= 8,
        "draw_gpu_ms_p50": percentile(gpu_ms, 50),
    }


def streamer_bound(ctx: moderngl.Context, pack: Path, view_px: int, max_frames: int) -> dict:
    """The same pan with the feedback written by the CPU instead of rasterized: each frame names the
    level-0 pages under a fresh `view_px`^2 window. Nothing is drawn, so neither rasterization nor the
    driver's texture sync limits the rate: this is what the streamer itself delivers."""
    from ..runtime.streamer import Streamer

    _warm_page_cache(pack)
    with PackReader(pack) as r:
        h = r.header
    t, w = h.tile_size, view_px
    path = _serpentine(np.arange(0, h.width - w + 1, w), np.arange(0, h.height - w + 1, w), max_frames)
    frames = 0
    with Streamer(ctx, pan_config(pack)) as s:
        vt = s.open(pack)
        throttle = s.gl.throttle(THROTTLE)
        ctx.finish()
        start = s.stats().totals
        t0 = time.perf_counter()
        for i in range(len(path) + 1000):
            s.update()
            throttle.frame_done()
            frames += 1
            if i < len(path):
                x0, y0 = path[i]
                yy, xx = np.mgrid[y0 // t : -(-(y0 + w) // t), x0 // t : -(-(x0 + w) // t)]
                s.inject_feedback(vt.table.ids(0, xx.ravel(), yy.ravel()))
            elif not s.busy:
                break
        ctx.finish()
        seconds = time.perf_counter() - t0
        tiles = s.stats().totals.uploads - start.uploads
        nbytes = s.stats().totals.upload_bytes - start.upload_bytes
        throttle.release()
    return {
        "pack": pack.name,
        "window": view_px,
        "frames": frames,
        "tiles": tiles,
        "seconds": seconds,
        "tiles_per_s": tiles / seconds,
        "mib_per_s": nbytes / seconds / MIB,
        "fps": frames / seconds,
    }
