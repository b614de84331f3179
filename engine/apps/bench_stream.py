"""`texstream bench stream`: the streaming core measured against ceilings taken in the same run.

On one headless context, in one run:

(a) upload ceiling: tiles/s of the engine's best upload path (`GLExt.upload_runs`: one call per run
    of consecutive layers at one cell, the compiled loop when built), in batches fenced like the
    uploader's, timed until glFinish: no disk, no decode, no bookkeeping. Every engine path the
    context runs is measured: runs straight from the persistent-mapped host ring, runs through the
    device-local staging buffer (one glCopyBufferSubData per batch, `UploadPath.DEVICE_BUFFER`), and
    the compute-filled staging texture (one dispatch per ring span, one glCopyImageSubData per run,
    `UploadPath.STAGING_TEXTURE`); the fastest is the ceiling, and the path the streamer's AUTO picks
    on this context is reported; the staging array filled by pixel transfers instead is measured as a
    candidate beside them. Also: the host-ring
    runs with the pure-Python loop (what the compiled loop buys), the old one-call-per-tile path
    (`upload_cell_batch`), and the host -> device copy bandwidth (glCopyBufferSubData of the whole
    ring into video memory: the bus, the physical limit);
(b) end to end: tiles/s the streamer delivers (feedback, scheduler, batched reads with checksum and
    zstd on the I/O threads, uploads, page tables) while a plane drawn at 1:1 pans a whole frame per
    frame over a pack in the page cache, with caps that never bind; once with the compiled I/O and
    upload loops and once with the pure-Python ones (the interpreter lock's share);
(b') streamer-bound: the same pan with the feedback written by the CPU (nothing drawn);
(c) update(): wall and render-thread CPU time per frame with three virtual textures (terrain BC1,
    normals BC5, detail BC1) on the terrain scene's perspective flythrough at 1920x1080 (quick:
    960x540) in the demo's budget; p50/p95/p99, the worst after the first second, and how many frames
    did real work (wanted pages, uploads); twice, then once with a 1 ms upload time budget;
(d) latency: frames from a load's submission to its upload, from (b);
(e) camera cuts: random cuts across the terrain in the same scene; per cut, frames until nothing the
    feedback wants is missing (the first feedback of the new view counted from the cut frame).

Ratios against (a) and absolute figures of this machine; the GL renderer is reported (on llvmpipe
the "GPU" is the same cores that read and decode).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import moderngl
import numpy as np

from ..config import BakeConfig, BudgetConfig, StreamerConfig, UploadPath
from ..pack.format import TexelFormat
from .bench_pan import THROTTLE, drawn_resident, end_to_end, percentile, streamer_bound
from .bench_stream_report import print_stream
from .bench_upload import CEILING_ARGS, TILE, ceiling_paths, copy_bandwidth, upload_ceiling

__all__ = ["run_stream_bench"]

log = logging.getLogger(__name__)

TIMED_UPLOAD_MS = 1.0  # (c) once more with StreamerConfig.upload_time_budget_ms


class _GcPauses:
    """Collector pauses during a measured loop (a generation-2 collection can take milliseconds)."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append((time.perf_counter() - self._t0) * 1e3)

    def __enter__(self) -> _GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> dict:
        return {"collections": len(self.pauses), "max_ms": max(self.pauses, default=0.0), "total_ms": sum(self.pauses)}


# ---- packs -----------------------------------------------------------------------------------------
def _bake_packs(folder: Path, quick: bool) -> dict[str, Path]:
    """terrain (BC1), normals (BC5), detail (BC1): quick ones baked into `folder`, full ones the demo's
    cached assets plus a 16384^2 detail texture."""
    from ..bake.pipeline import bake_procedural
    from .assets import DEFAULT_NORMALS, DEFAULT_TERRAIN, AssetRecipe, ensure_asset

    detail = AssetRecipe(name="detail", pattern="terrain", size=16384, seed=7, texel_format=TexelFormat.BC1)
    if not quick:
        return {
            name: ensure_asset(r, progress=False)
            for name, r in (("terrain", DEFAULT_TERRAIN), ("normals", DEFAULT_NORMALS), ("detail", detail))
        }
    common = {"tile_size": TILE, "progress": False}
    specs = {
        "terrain": (8192, "terrain", 1, BakeConfig(**common)),
        "normals": (2048, "normals", 1, BakeConfig(texel_format=TexelFormat.BC5, **common)),
        "detail": (2048, "terrain", 7, BakeConfig(**common)),
    }
    out = {}
    for name, (size, pattern, seed, cfg) in specs.items():
        out[name] = folder / f"{name}-{size}.tpk"
        bake_procedural(out[name], size, pattern, seed, cfg)
    return out


# ---- (c) update() on the three-texture scene and (e) camera cuts -----------------------------------
def _python_threads_hook(batch: object) -> None:
    """A read hook that does nothing: with one set, every read goes to Python I/O threads (hooks run
    Python on the reading thread), the comparison for the compiled readers."""


class _Scene:
    """Terrain + normals + detail streamed into one budget, drawn by TerrainScene offscreen."""

    def __init__(
        self,
        ctx: moderngl.Context,
        packs: dict[str, Path],
        size: tuple[int, int],
        budget_mb: float,
        upload_time_budget_ms: float | None = None,
        python_io: bool = False,
    ) -> None:
        from ..runtime.streamer import Streamer
        from ..scene.terrain import TerrainScene

        self.ctx, self.size = ctx, size
        cfg = StreamerConfig(budget=BudgetConfig(budget_mb=budget_mb), upload_time_budget_ms=upload_time_budget_ms)
        self.streamer = Streamer(ctx, cfg, read_hook=_python_threads_hook if python_io else None)
        try:
            s = self.streamer
            self.textures = [s.open(packs["terrain"]), s.open(packs["normals"]), s.open(packs["detail"])]
            self.scene = TerrainScene(ctx, *self.textures)
            self.fbo = ctx.simple_framebuffer(size)
            self.throttle = s.gl.throttle(THROTTLE)
        except BaseException:
            self.streamer.release()
            raise

    @property
    def ground(self) -> tuple[int, int]:
        h = self.textures[0].header
        return h.width, h.height

    def frame(self, pose) -> object:  # noqa: ANN001 (Pose) -> FrameStats
        from ..scene.terrain import sky_clear_colour

        st = self.streamer.update()
        self.fbo.use()
        self.fbo.clear(*sky_clear_colour(), 1.0)
        self.scene.draw(pose, self.size)
        self.throttle.frame_done()
        return st

    def release(self) -> None:
        if self.ctx.fbo is self.fbo:
            self.ctx.detect_framebuffer(0).use()
        self.throttle.release()
        self.fbo.release()
        self.scene.release()
        self.streamer.release()


def scene_update(
    ctx: moderngl.Context,
    packs: dict[str, Path],
    size: tuple[int, int],
    budget_mb: float,
    seconds: float,
    fps: float = 60.0,
    upload_time_budget_ms: float | None = None,
    paced: bool = False,
    python_io: bool = False,
) -> dict:
    """update() per frame on the perspective flythrough (fixed frame clock: the same poses everywhere).
    `paced`: each frame starts on the next 1/`fps` tick, as in a vsynced game loop (the I/O threads
    have the rest of the tick to finish; the CPU idles between frames); unpaced, frames run back to
    back. `python_io`: Python I/O threads instead of the compiled readers (a no-op read hook)."""
    from ..scene.paths import flythrough

    scene = _Scene(ctx, packs, size, budget_mb, upload_time_budget_ms, python_io)
    from ..runtime.frame_stats import PHASES

    wall, cpu, wanted, uploads, requested, evicted = [], [], [], [], [], []
    phases = []
    try:
        w, h = scene.ground
        path = flythrough(w, h, seconds=seconds)
        n = path.frames(fps)
        t0 = next_tick = time.perf_counter()
        with _GcPauses() as pauses:
            for i in range(n):
                if paced:
                    time.sleep(max(0.0, next_tick - time.perf_counter()))
                    next_tick = max(next_tick + 1.0 / fps, time.perf_counter())
                st = scene.frame(path.pose(i / fps))
                wall.append(st.update_ms)
                cpu.append(st.update_cpu_ms)
                wanted.append(st.wanted_pages)
                uploads.append(st.uploads)
                requested.append(st.requested)
                evicted.append(st.evicted)
                phases.append([getattr(st, p) for p in PHASES])
        ctx.finish()
        elapsed = time.perf_counter() - t0
        pools = sorted(p.name for p in scene.streamer.pools.values())
        peak = scene.streamer.budget.peak
    finally:
        scene.release()
    after = np.asarray(wall[int(fps) :] or wall)
    up = np.asarray(uploads)
    streaming = (up > 0) | (np.asarray(requested) > 0)
    ph, w = np.asarray(phases), np.asarray(wall)
    worst = np.argsort(wall)[::-1][:3]
    return {
        "frame_size": list(size),
        "budget_mb": budget_mb,
        "textures": [p.name for p in packs.values()],
        "pools": pools,
        "frames": n,
        "paced_fps": fps if paced else None,
        "python_io": python_io,
        "fps_wall": n / elapsed,
        "vram_peak_bytes": int(peak),
        "update_ms_p50": percentile(wall, 50),
        "update_ms_p95": percentile(wall, 95),
        "update_ms_p99": percentile(wall, 99),
        "update_ms_max_after_1s": float(after.max()),
        "update_cpu_ms_p50": percentile(cpu, 50),
        "update_cpu_ms_p95": percentile(cpu, 95),
        "wanted_pages_p50": percentile(wanted, 50),
        "frames_with_uploads": float(np.mean(up > 0)),
        "streaming_frames": int(np.count_nonzero(streaming)),
        "streaming_update_ms": {
            "p50": percentile(w[streaming], 50),
            "p95": percentile(w[streaming], 95),
            "p99": percentile(w[streaming], 99),
            "max": float(w[streaming].max()) if streaming.any() else 0.0,
        },
        "phases_ms": {  # mean ms per update() phase (FrameStats), on frames that stream and on the rest
            kind: {p: float(ph[sel, k].mean()) if sel.any() else 0.0 for k, p in enumerate(PHASES)}
            for kind, sel in (("streaming", streaming), ("idle", ~streaming))
        },
        "uploads": int(up.sum()),
        "uploads_per_frame_p95": percentile(up, 95),
        "gc": pauses.summary(),
        "worst_frames": [
            {
                "frame": int(i),
                "wall_ms": wall[i],
                "cpu_ms": cpu[i],
                "uploads": uploads[i],
                "requested": requested[i],
                "evicted": evicted[i],
            }
            for i in worst
        ],
    }


def camera_cuts(
    ctx: moderngl.Context,
    packs: dict[str, Path],
    size: tuple[int, int],
    budget_mb: float,
    cuts: int,
    hold: int = 24,
    seed: int = 11,
    fps: float | None = None,
    announce: bool = False,
) -> dict:
    """Random cuts across the terrain; per cut, frames until the streamer reports nothing missing
    for feedback drawn after the cut. With `fps`, frames are paced like a vsynced game loop (the GPU
    then finishes each frame before the next starts, so the feedback comes back a frame later);
    without, the loop runs as fast as the GPU allows, two frames queued. With `announce`, the loop
    tells the streamer of each cut (`Streamer.camera_cut`), as a game that cuts its camera can.

    Per cut, "detail" adds: the first frame whose feedback was drawn after the cut, the uploads
    until done, the frames until nothing is missing for the rest of the hold ("settled": pages the
    sparse feedback finds late count there), the pages wanted and missing (-1: no feedback drawn
    after the cut yet) and the loads issued a frame, and the frames whose draws recorded dense
    feedback."""
    from ..scene.paths import Pose

    scene = _Scene(ctx, packs, size, budget_mb)
    rng = np.random.default_rng(seed)
    result, detail = [], []
    update_ms = []
    next_tick = time.perf_counter()
    try:
        w, h = scene.ground
        frame = 0
        for _ in range(cuts):
            x, y = rng.uniform(0.1, 0.9, 2) * (w, h)
            ang = rng.uniform(0, 2 * np.pi)
            eye = np.array([x, y, -rng.uniform(40, 120)])
            pose = Pose(eye, np.array([x + 400 * np.cos(ang), y + 400 * np.sin(ang), 0]))
            cut_frame, done, first, loaded = frame, None, None, 0
            wanted, missing, requested, dense = [], [], [], []
            if announce:
                scene.streamer.camera_cut()
            for k in range(hold):
                if fps:
                    time.sleep(max(0.0, next_tick - time.perf_counter()))
                    next_tick = max(next_tick + 1.0 / fps, time.perf_counter())
                st = scene.frame(pose)
                frame += 1
                update_ms.append(st.update_ms)
                fresh = st.feedback_age >= 0 and st.frame - st.feedback_age >= cut_frame + 1  # drawn after the cut
                if fresh and first is None:
                    first = k
                if done is None:
                    loaded += st.uploads
                if done is None and fresh and st.wanted_pages and st.missing_pages == 0:
                    done = k
                wanted.append(st.wanted_pages if fresh else 0)
                missing.append(st.missing_pages if fresh else -1)
                requested.append(st.requested)
                dense.append(st.feedback_stride < scene.streamer.feedback_info().stride)
            result.append(done if done is not None else hold)
            late = [k for k, m in enumerate(missing) if m != 0]  # unfresh (-1) or missing pages
            detail.append(
                {
                    "first_feedback": first,
                    "uploads_until_done": loaded,
                    "settled": late[-1] + 1 if late else 0,
                    "wanted_pages": wanted,
                    "missing_pages": missing,
                    "requested": requested,  # loads issued a frame (StreamerConfig.upload_tiles_per_frame caps it)
                    "dense_frames": int(sum(dense)),
                }
            )
        ctx.finish()
    finally:
        scene.release()
    r = np.asarray(result)
    settled = np.asarray([d["settled"] for d in detail])
    return {
        "cuts": cuts,
        "announced": announce,
        "hold_frames": hold,
        "paced_fps": fps,
        "frames_to_complete": r.tolist(),
        "mean": float(r.mean()),
        "p50": percentile(r, 50),
        "p95": percentile(r, 95),
        "max": int(r.max()),
        "unfinished": int(np.count_nonzero(r >= hold)),
        "settled": {"mean": float(settled.mean()), "p95": percentile(settled, 95), "max": int(settled.max())},
        "detail": detail,
        "update_ms_p50": percentile(update_ms, 50),
        "update_ms_p95": percentile(update_ms, 95),
    }


# ---- the run ---------------------------------------------------------------------------------------
def run_stream_bench(quick: bool = False, json_path: str | None = None) -> dict:
    """Run (a)-(e) on a fresh headless context; print a table; write JSON to `json_path` if given."""
    from ..errors import GLError
    from ..gl.context import headless_context
    from ..gl.gl_ext import GLExt

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
        n = 16384 if quick else 131072
        gl = GLExt(ctx)
        engine_paths = ceiling_paths(gl)
        upload_ceiling(ctx, n // 8, runs=True, device=gl.has_buffer_storage)  # warm-up: the first pass runs slower
        tries: dict[UploadPath, list[dict]] = {p: [] for p in engine_paths}
        for _ in range(2):  # interleaved, best of two each
            for p in engine_paths:
                tries[p].append(upload_ceiling(ctx, n, runs=True, **CEILING_ARGS[p]))
        best = {p: max(t, key=lambda r: r["tiles_per_s"]) for p, t in tries.items()}
        host = result["upload_ceiling_host_ring"] = best[UploadPath.HOST_RING]
        if UploadPath.DEVICE_BUFFER in best:
            result["upload_ceiling_device"] = best[UploadPath.DEVICE_BUFFER]
        if UploadPath.STAGING_TEXTURE in best:
            result["upload_ceiling_staging_texture"] = best[UploadPath.STAGING_TEXTURE]
        result["upload_ceiling_tries"] = {p.value: t for p, t in tries.items()}
        try:  # a candidate path, not the engine's: measured so the choice rests on numbers
            result["upload_candidate_upload_fill"] = upload_ceiling(ctx, n, runs=True, candidate=True)
        except GLError as exc:
            result["upload_candidate_upload_fill"] = {"error": str(exc)}
        result["upload_ceiling"] = max(best.values(), key=lambda r: r["tiles_per_s"])  # the engine's best path
        result["upload_ceiling_python"] = upload_ceiling(ctx, n // 4, compiled=False, runs=True)
        result["upload_per_tile"] = upload_ceiling(ctx, n)
        result["copy_bandwidth"] = copy_bandwidth(ctx, 16 if quick else 64)
        with tempfile.TemporaryDirectory(prefix="texstream-bench-") as tmp:
            t0 = time.perf_counter()
            packs = _bake_packs(Path(tmp), quick)
            result["packs_seconds"] = time.perf_counter() - t0
            terrain = packs["terrain"]
            pan = (768, 768) if quick else (2048, 2048)
            frames = 60 if quick else 200
            result["streamer_bound"] = streamer_bound(ctx, terrain, 2048 if quick else 4096, 16 if quick else 48)
            first = end_to_end(ctx, terrain, pan, frames, native=True)
            result["upload_path_auto"] = auto = first["upload_path"]
            others = [p for p in engine_paths if p.value != auto]
            pans: dict[str, list[dict]] = {auto: [first]} | {p.value: [] for p in others}
            for _ in range(2):  # AUTO's path and the others interleaved, best of two each
                for other in others:
                    pans[other.value].append(end_to_end(ctx, terrain, pan, frames, True, other))
                if len(pans[auto]) < 2:
                    pans[auto].append(end_to_end(ctx, terrain, pan, frames, native=True))
            result["end_to_end"] = max(pans[auto], key=lambda r: r["tiles_per_s"])
            result["end_to_end_other_paths"] = {
                p.value: max(pans[p.value], key=lambda r: r["tiles_per_s"]) for p in others
            }
            result["end_to_end_tries"] = pans
            result["end_to_end_python"] = end_to_end(ctx, terrain, pan, frames, native=False)
            drawn = result["drawn_resident"] = drawn_resident(ctx, terrain, pan, frames)
            e2e = result["end_to_end"]
            drawn["tiles_per_s_at_e2e_tiles_a_frame"] = drawn["fps"] * e2e["tiles"] / e2e["frames"]
            size = (960, 540) if quick else (1920, 1080)
            budget = 16.0 if quick else 192.0
            result["scene_update"] = scene_update(ctx, packs, size, budget, 8.0 if quick else 20.0)
            result["scene_update_python_io"] = scene_update(
                ctx, packs, size, budget, 8.0 if quick else 20.0, python_io=True
            )  # between the two runs of the default, so that a drift of the machine shows
            result["scene_update_again"] = scene_update(ctx, packs, size, budget, 8.0 if quick else 20.0)
            result["scene_update_timed"] = scene_update(
                ctx, packs, size, budget, 8.0 if quick else 20.0, upload_time_budget_ms=TIMED_UPLOAD_MS
            ) | {"upload_time_budget_ms": TIMED_UPLOAD_MS}
            result["scene_update_paced"] = scene_update(ctx, packs, size, budget, 4.0 if quick else 20.0, paced=True)
            result["camera_cuts"] = camera_cuts(ctx, packs, size, budget, 8 if quick else 24)
            result["camera_cuts_60hz"] = camera_cuts(ctx, packs, size, budget, 8 if quick else 24, fps=60.0)
            result["camera_cuts_60hz_announced"] = camera_cuts(
                ctx, packs, size, budget, 8 if quick else 24, fps=60.0, announce=True
            )
        ceiling = result["upload_ceiling"]["tiles_per_s"]
        result["ratios"] = {
            "end_to_end_vs_ceiling": result["end_to_end"]["tiles_per_s"] / ceiling,
            "device_vs_host_ring": result.get("upload_ceiling_device", host)["tiles_per_s"] / host["tiles_per_s"],
            "staging_texture_vs_host_ring": result.get("upload_ceiling_staging_texture", host)["tiles_per_s"]
            / host["tiles_per_s"],
            "end_to_end_python_vs_ceiling": result["end_to_end_python"]["tiles_per_s"] / ceiling,
            "streamer_bound_vs_ceiling": result["streamer_bound"]["tiles_per_s"] / ceiling,
            "end_to_end_vs_drawing": result["end_to_end"]["tiles_per_s"]
            / result["drawn_resident"]["tiles_per_s_at_e2e_tiles_a_frame"],
            "compiled_vs_python_upload_loop": host["tiles_per_s"] / result["upload_ceiling_python"]["tiles_per_s"],
            "runs_vs_per_tile": ceiling / result["upload_per_tile"]["tiles_per_s"],
            "ceiling_vs_copy": ceiling / result["copy_bandwidth"]["bc1_tiles_per_s"],
        }
        result["seconds"] = time.perf_counter() - t_start
    finally:
        ctx.release()
    print_stream(result)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result
