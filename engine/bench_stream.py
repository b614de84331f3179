"""`texstream bench stream`: streaming throughput against a ceiling measured in the same run.

Measured in one run, on one headless context:

(a) upload ceiling: tiles/s of glCompressedTexSubImage3D from the persistent-mapped staging ring
    into a cache texture array, batched and fenced like the streamer does, timed until glFinish
    (no disk, no decode, no page tables: what the GPU path alone allows);
(b) end to end: tiles/s the streamer delivers (read + checksum + decompress on the I/O threads,
    upload, page-table update) while a scripted camera pans at 1:1 across a large pack whose file
    is in the page cache (read once first), with generous per-frame caps; reported with the share of
    frames that ended with loads still pending (close to 1: supply-limited, the rate is the
    streamer's; low: the camera asked for less than the streamer could do);
(c) render-thread cost: `update()` minus its uploads (FrameStats.update_ms - upload_ms), per frame,
    with three virtual textures (BC1, BC5, BC4) open and drawn at 1920x1080 (960x540 quick);
(d) latency: frames from issuing a load to its tile being resident (p50 / p95), from run (b).

Results are ratios against (a) and absolute numbers of this machine; the GL renderer is reported
(llvmpipe: the "GPU" is the same cores that read and decompress, so the ratio is pessimistic).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path

import moderngl
import numpy as np

from .config import BakeConfig, BudgetConfig, StreamerConfig
from .pack.format import TexelFormat
from .pack.reader import PackReader

__all__ = ["run_stream_bench"]

log = logging.getLogger(__name__)

TILE = 128  # the default tile: 136-texel slots
MIB = 1 << 20


# ---- (a) the upload ceiling -----------------------------------------------------------------------
def upload_ceiling(ctx: moderngl.Context, tiles: int, batch: int = 64) -> dict:
    """Tiles/s of compressed sub-image uploads from the staging ring, fenced, until glFinish."""
    from .gl.gl_ext import GLExt, gl_format
    from .runtime.staging import StagingRing
    from .runtime.tile_cache import SlotGeometry

    gl = GLExt(ctx)
    fmt = gl_format(TexelFormat.BC1, True)
    slot = TILE + 8
    tile_bytes = fmt.layer_bytes(slot)
    capacity = 1024
    geo = SlotGeometry.choose(slot, tile_bytes, capacity, max_layers=gl.max_array_layers,
                              max_texture_size=min(gl.max_texture_size, 16384))  # fmt: skip
    layers = -(-capacity // geo.cells)
    ring = StagingRing(ctx, gl, 4 * batch * tile_bytes, tile_bytes)
    tex = gl.create_texture_array(fmt, geo.layer_size[0], layers)
    try:
        rng = np.random.default_rng(1)
        for s in ring.slots:  # any bytes are valid BC1 blocks; filled once (no decode in this path)
            s.view[:] = rng.integers(0, 256, tile_bytes, np.uint8).tobytes()
        ctx.finish()
        done, cell = 0, 0
        t0 = time.perf_counter()
        while done < tiles:
            ring.reclaim()
            got = []
            while len(got) < min(batch, tiles - done):
                s = ring.acquire()
                if s is None:
                    break
                ring.mark_ready(s, tile_bytes)
                got.append(s)
            if not got:
                time.sleep(0)  # every slot waits on the GPU: poll again
                continue
            cells = (np.arange(cell, cell + len(got)) % (layers * geo.cells)).astype(np.int64)
            lay, cx, cy = geo.locate(cells)
            regions = [(int(lay[i]), int(cx[i]) * slot, int(cy[i]) * slot, s.offset, tile_bytes)
                       for i, s in enumerate(got)]  # fmt: skip
            with ring.batch(got) as pbo:
                gl.upload_cells(tex, regions, slot, pbo)
            cell += len(got)
            done += len(got)
        ctx.finish()
        seconds = time.perf_counter() - t0
        ring.reclaim()
    finally:
        tex.release()
        ring.release()
    return {
        "tiles": done,
        "seconds": seconds,
        "tiles_per_s": done / seconds,
        "mib_per_s": done * tile_bytes / seconds / MIB,
        "tile_bytes": tile_bytes,
        "format": "bc1-srgb",
        "slot": slot,
        "batch": batch,
        "persistent_ring": ring.persistent,
    }


# ---- packs -----------------------------------------------------------------------------------------
def _bake_packs(folder: Path, quick: bool) -> dict[str, Path]:
    from .bake.pipeline import bake_procedural

    big = 8192 if quick else 16384
    small = 2048 if quick else 4096
    common = {"tile_size": TILE, "progress": False}
    specs = {
        "terrain": (big, "terrain", BakeConfig(**common)),
        "normals": (small, "normals", BakeConfig(texel_format=TexelFormat.BC5, **common)),
        "height": (small, "checker", BakeConfig(texel_format=TexelFormat.BC4, **common)),
    }
    out = {}
    for name, (size, pattern, cfg) in specs.items():
        out[name] = folder / f"{name}-{size}.tpk"
        bake_procedural(out[name], size, pattern, 7, cfg)
    return out


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


def _pan_config(pack: Path) -> StreamerConfig:
    """Budget for the whole pack, a 64 MiB ring, an I/O thread a core, caps that never bind."""
    return StreamerConfig(budget=BudgetConfig(budget_mb=_budget_mb([pack])), ring_mb=64,
                          io_threads=max(2, os.cpu_count() or 2), upload_tiles_per_frame=4096,
                          upload_bytes_per_frame=256 * MIB)  # fmt: skip


# ---- (b) end to end and (d) latency ----------------------------------------------------------------
def end_to_end(ctx: moderngl.Context, pack: Path, size: tuple[int, int], max_frames: int) -> dict:
    """The streamer's tiles/s on a boustrophedon pan at 1:1 moving a whole frame per frame (every
    frame shows only tiles never seen before: the demand stays above what can be delivered)."""
    from .render import PlaneRenderer
    from .runtime.streamer import Streamer
    from .scene.camera import View

    _warm_page_cache(pack)
    with PackReader(pack) as r:
        tex_w, tex_h = r.header.width, r.header.height
    w, h = size
    path = _serpentine(np.arange(w / 2, tex_w - w / 2 + 1, w), np.arange(h / 2, tex_h - h / 2 + 1, h), max_frames)
    cfg = _pan_config(pack)
    renderer = PlaneRenderer(ctx, size)
    latencies: list[int] = []
    io_seconds: list[float] = []
    backlog: list[int] = []  # loads issued but not resident yet, after each update
    update_ms: list[float] = []
    try:
        with Streamer(ctx, cfg) as s:
            vt = s.open(pack)
            drain = s.io.drain

            def timed_drain(limit: int | None = None):  # noqa: ANN202 (bench instrumentation)
                jobs = drain(limit)
                io_seconds.extend(j.seconds for j in jobs)
                return jobs

            s.io.drain = timed_drain  # type: ignore[method-assign]
            s.update()
            renderer.draw(vt, View(path[0][0] / tex_w, path[0][1] / tex_h, 1.0))
            ctx.finish()
            start = dict(s.totals)
            t0 = time.perf_counter()
            for x, y in path:
                st = s.update()
                renderer.draw(vt, View(x / tex_w, y / tex_h, 1.0))
                latencies.extend(st.latency_frames)
                update_ms.append(st.update_ms)
                backlog.append(st.in_flight + len(s._ready))
            ctx.finish()
            seconds = time.perf_counter() - t0
            tiles = s.totals["uploads"] - start["uploads"]
            issued = s.totals["requested"] - start["requested"]
            nbytes = s.totals["upload_bytes"] - start["upload_bytes"]
            ring = s.ring.stats() if s.ring is not None else None
    finally:
        renderer.release()
    lat = np.array(latencies or [0])
    io_us = float(np.mean(io_seconds)) * 1e6 if io_seconds else 0.0
    return {
        "pack": pack.name,
        "frame_size": list(size),
        "frames": len(path),
        "tiles": tiles,
        "seconds": seconds,
        "tiles_per_s": tiles / seconds,
        "mib_per_s": nbytes / seconds / MIB,
        "fps": len(path) / seconds,
        "issued": issued,
        "backlog_mean": float(np.mean(backlog)),
        "backlog_frames_share": float(np.mean(np.array(backlog) > 0)),
        "update_ms_p50": float(np.percentile(update_ms, 50)),
        "io_threads": cfg.io_threads,
        "io_us_per_tile": io_us,  # pread + decompress + checksum, on a worker (GIL waits included)
        "io_capacity_tiles_per_s": cfg.io_threads / (io_us * 1e-6) if io_us else 0.0,
        "frame_bound": bool(np.percentile(lat, 95) <= 1),  # all issued loads landed by the next frame
        "ring_stalls": ring.stalls if ring else 0,
        "latency_frames_p50": float(np.percentile(lat, 50)),
        "latency_frames_p95": float(np.percentile(lat, 95)),
        "latency_samples": len(latencies),
    }


def streamer_bound(ctx: moderngl.Context, pack: Path, view_px: int, max_frames: int) -> dict:
    """The same pan with the feedback written by the CPU instead of rasterized: each frame names the
    level-0 pages under a fresh `view_px`^2 window (what a 1:1 top view's feedback names). Nothing
    is drawn, so neither rasterization nor the driver's texture sync limits the rate: this is what
    the streamer itself delivers (feedback -> scheduler -> I/O -> upload -> page tables)."""
    from .runtime.feedback_reduce import pack_feedback
    from .runtime.streamer import Streamer

    _warm_page_cache(pack)
    with PackReader(pack) as r:
        h = r.header
    t = h.tile_size
    w = view_px
    path = _serpentine(np.arange(0, h.width - w + 1, w), np.arange(0, h.height - w + 1, w), max_frames)
    cfg = _pan_config(pack)
    latencies: list[int] = []
    frames = 0
    with Streamer(ctx, cfg) as s:
        vt = s.open(pack)
        ctx.finish()
        start = dict(s.totals)
        t0 = time.perf_counter()
        for i in range(len(path) + 1000):
            st = s.update()
            latencies.extend(st.latency_frames)
            frames += 1
            fb = s.feedback._current  # the buffer the coming draw would append to
            if i < len(path) and fb is not None:
                x0, y0 = path[i]
                yy, xx = np.mgrid[y0 // t : -(-(y0 + w) // t), x0 // t : -(-(x0 + w) // t)]
                ids = pack_feedback(vt.id, 0, xx.ravel(), yy.ravel())
                head = np.array([ids.size, s.feedback.capacity, s.feedback.stride, 0], np.uint32)
                fb.buffer.write(head.tobytes() + ids.tobytes())
            elif i >= len(path) and not s.busy:
                break
        ctx.finish()
        seconds = time.perf_counter() - t0
        tiles = s.totals["uploads"] - start["uploads"]
        nbytes = s.totals["upload_bytes"] - start["upload_bytes"]
    lat = np.array(latencies or [0])
    return {
        "pack": pack.name,
        "window": view_px,
        "frames": frames,
        "tiles": tiles,
        "seconds": seconds,
        "tiles_per_s": tiles / seconds,
        "mib_per_s": nbytes / seconds / MIB,
        "fps": frames / seconds,
        "latency_frames_p50": float(np.percentile(lat, 50)),
        "latency_frames_p95": float(np.percentile(lat, 95)),
    }


# ---- (c) render-thread cost with three textures ----------------------------------------------------
def update_cost(ctx: moderngl.Context, packs: dict[str, Path], size: tuple[int, int], frames: int) -> dict:
    """update() minus its uploads, per frame, with three textures open and drawn each frame."""
    from .render import PlaneRenderer
    from .runtime.streamer import Streamer
    from .scene.camera import View

    cfg = StreamerConfig(budget=BudgetConfig(budget_mb=_budget_mb(list(packs.values()))), ring_mb=64)
    names = list(packs)
    renderers = [PlaneRenderer(ctx, size) for _ in names]
    warmup = 5
    cpu, upload, wanted, thread_cpu = [], [], [], []
    try:
        with Streamer(ctx, cfg) as s:
            vts = [s.open(packs[n]) for n in names]
            upload_cpu = [0.0]
            upload_ready = s._upload_ready

            def timed_upload(frame: int, st) -> None:  # noqa: ANN001 (bench instrumentation)
                c0 = time.thread_time()
                upload_ready(frame, st)
                upload_cpu[0] = time.thread_time() - c0

            s._upload_ready = timed_upload  # type: ignore[method-assign]
            for i in range(frames + warmup):
                t = i / max(1, frames)
                views = [
                    View(0.3 + 0.4 * t, 0.5, 0.5, 55.0, 20.0),  # oblique, minified: many levels at once
                    View(0.5, 0.3 + 0.4 * t, 1.0 + t),  # magnifying slowly
                    View(0.6 - 0.2 * t, 0.6, 0.35),  # minified pan
                ]
                c0 = time.thread_time()
                st = s.update()
                c1 = time.thread_time()
                for r, vt, v in zip(renderers, vts, views, strict=True):
                    r.draw(vt, v)
                if i >= warmup:
                    cpu.append(st.update_ms - st.upload_ms)
                    thread_cpu.append((c1 - c0 - upload_cpu[0]) * 1e3)
                    upload.append(st.upload_ms)
                    wanted.append(st.wanted_pages)
            ctx.finish()
            pools = sorted(p.name for p in s.pools.values())
    finally:
        for r in renderers:
            r.release()
    c = np.array(cpu)
    return {
        "frame_size": list(size),
        "textures": [packs[n].name for n in names],
        "pools": pools,
        "frames": len(cpu),
        "cpu_ms_p50": float(np.percentile(c, 50)),
        "cpu_ms_p95": float(np.percentile(c, 95)),
        "cpu_ms_max": float(c.max()),
        "thread_cpu_ms_p50": float(np.percentile(thread_cpu, 50)),  # same, CPU time of the thread only
        "thread_cpu_ms_p95": float(np.percentile(thread_cpu, 95)),
        "upload_ms_p50": float(np.percentile(upload, 50)),
        "wanted_pages_p50": float(np.percentile(wanted, 50)),
    }


# ---- the run ---------------------------------------------------------------------------------------
def run_stream_bench(quick: bool = False, json_path: str | None = None) -> dict:
    """Run (a)-(d) on a fresh headless context; print a table; write JSON to `json_path` if given."""
    from .gl.context import headless_context

    t_start = time.perf_counter()
    ctx = headless_context()
    try:
        info = ctx.info
        result: dict = {
            "bench": "stream",
            "quick": quick,
            "gl_renderer": info.get("GL_RENDERER", "?"),
            "gl_vendor": info.get("GL_VENDOR", "?"),
            "gl_version": info.get("GL_VERSION", "?"),
            "cpu_count": os.cpu_count(),
        }
        result["upload_ceiling"] = upload_ceiling(ctx, 4096 if quick else 32768)
        with tempfile.TemporaryDirectory(prefix="texstream-bench-") as tmp:
            t0 = time.perf_counter()
            packs = _bake_packs(Path(tmp), quick)
            result["bake_seconds"] = time.perf_counter() - t0
            result["streamer_bound"] = streamer_bound(ctx, packs["terrain"], 2048, 16 if quick else 64)
            e2e = end_to_end(ctx, packs["terrain"], (768, 768) if quick else (1024, 1024), 80 if quick else 200)
            result["end_to_end"] = {k: v for k, v in e2e.items() if not k.startswith("latency")}
            result["latency_frames"] = {
                "p50": e2e["latency_frames_p50"],
                "p95": e2e["latency_frames_p95"],
                "samples": e2e["latency_samples"],
                "definition": "frames from issuing a load to its tile being resident",
            }
            size = (960, 540) if quick else (1920, 1080)
            result["update_cpu"] = update_cost(ctx, packs, size, 30 if quick else 120)
        ceiling = result["upload_ceiling"]["tiles_per_s"]
        result["ratios"] = {
            "end_to_end_vs_ceiling": result["end_to_end"]["tiles_per_s"] / ceiling,
            "streamer_bound_vs_ceiling": result["streamer_bound"]["tiles_per_s"] / ceiling,
        }
        result["seconds"] = time.perf_counter() - t_start
    finally:
        ctx.release()
    print_stream(result)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


def print_stream(r: dict) -> None:
    """The results as a table: measure, value, what it means."""
    up, e2e, sb = r["upload_ceiling"], r["end_to_end"], r["streamer_bound"]
    cpu, lat, ratio = r["update_cpu"], r["latency_frames"], r["ratios"]
    quick = " (quick)" if r["quick"] else ""
    print(f"texstream bench stream{quick} on {r['gl_renderer']} ({r['gl_version']}), {r['cpu_count']} CPUs")
    fw, fh = e2e["frame_size"]
    cw, ch = cpu["frame_size"]
    bound = "; all loads landed by the next frame: frame-bound" if e2e["frame_bound"] else ""
    rows = [
        ("(a) upload ceiling", f"{up['tiles_per_s']:,.0f} tiles/s",
         f"{up['mib_per_s']:,.0f} MiB/s, {up['tiles']} {up['format']} {up['slot']}^2 tiles, "
         f"batches of {up['batch']}, fenced + finished"),
        ("(b) end to end, drawn", f"{e2e['tiles_per_s']:,.0f} tiles/s",
         f"{e2e['mib_per_s']:,.0f} MiB/s, {e2e['tiles']} tiles in {e2e['frames']} frames at {fw}x{fh} "
         f"({e2e['fps']:.0f} fps)"),
        ("    I/O per tile", f"{e2e['io_us_per_tile']:,.0f} us",
         f"read + decompress + checksum: {e2e['io_capacity_tiles_per_s']:,.0f} tiles/s "
         f"on {e2e['io_threads']} threads{bound}"),
        ("    ratio (b)/(a)", f"{ratio['end_to_end_vs_ceiling']:.3f}",
         "warm page cache, zstd + xxh3 per tile"),
        ("(b') streamer-bound", f"{sb['tiles_per_s']:,.0f} tiles/s",
         f"{sb['mib_per_s']:,.0f} MiB/s, {sb['tiles']} tiles, same pan with CPU-written feedback "
         f"({sb['window']}^2 windows, nothing drawn), {sb['fps']:.0f} updates/s"),
        ("    ratio (b')/(a)", f"{ratio['streamer_bound_vs_ceiling']:.3f}", ""),
        ("(c) update() - uploads", f"{cpu['cpu_ms_p50']:.2f} ms p50",
         f"p95 {cpu['cpu_ms_p95']:.2f}, max {cpu['cpu_ms_max']:.2f} ms wall; 3 textures at {cw}x{ch}, "
         f"{cpu['frames']} frames (uploads p50 {cpu['upload_ms_p50']:.2f} ms)"),
        ("    thread CPU", f"{cpu['thread_cpu_ms_p50']:.2f} ms p50",
         f"p95 {cpu['thread_cpu_ms_p95']:.2f} ms: the render thread's own CPU time; the rest of the "
         "wall time waits on the driver or the GIL"),
        ("(d) latency", f"{lat['p50']:.0f} / {lat['p95']:.0f} frames",
         f"p50 / p95 from issue to resident, {lat['samples']} tiles of (b); (b'): "
         f"{sb['latency_frames_p50']:.0f} / {sb['latency_frames_p95']:.0f}"),
    ]  # fmt: skip
    width = max(len(a) for a, _, _ in rows)
    for a, b, c in rows:
        print(f"  {a:<{width}}  {b:>16}  {c}".rstrip())
