"""`texstream bench scene`: the terrain demo's scripted camera paths, measured in one run.

Over a procedural terrain (albedo BC1 + a BC5 normal map at half resolution; quick: 4096^2 + 2048^2
baked into a temp folder in about a second; full: the default 32768^2 + 16384^2 assets), each path
plays with a fixed frame clock (dt = 1/60 s: the same poses on every machine) on a fresh Streamer,
drawn by TerrainScene into an offscreen framebuffer (quick 480x270, full 1920x1080):

- flythrough, whip_pans, region_cuts at the regular budget (quick 8 MiB, full 192 MiB: the demo's);
- oversubscribed at a budget whose cache holds half the path's working set (2x oversubscribed).
  The working set is measured first on an all-resident reference: the distinct tiles (wanted pages
  plus their parents, pinned levels excluded: what the budget controller counts) that the feedback
  of a few frames names at poses sampled along the path; the budget is then the smallest whose
  most loaded pool holds at most half of its peak working set in unpinned slots.

Per path: uploads, tiles/s and MB/s (10^6 B/s) on the frame clock (what a 60 fps run asks for, also
its peak over 0.5 s windows) and on the wall clock, against the raw upload ceiling measured in the
same run (`bench_upload.upload_ceiling`: fenced glCompressedTexSubImage3D from the staging ring);
update() ms p50/p95, wall time and the render thread's own CPU time (on llvmpipe, update() also
waits for the frame's rasterization: the feedback fence's glMemoryBarrier and texture uploads into
arrays a queued draw samples); request-to-resident latency p50/p95/p99 in frames; engine
VRAM peak against the budget; re-fetches (tiles uploaded again within 30 frames of their eviction,
plus Telemetry's count of any re-upload); max mip bias.

region_cuts: after each cut, every frame is read back (PBOs, read two frames later, so the pipeline
keeps running) and compared with the same pose rendered by a second Streamer on which every tile
was made resident (`make_all_resident`); frames to converge is the index of the first frame after
the cut (the cut frame is 0) whose PSNR is >= 45 dB.

Naive side by side: level 0 of a pack extracted to PNG (not timed), then Pillow load + one
mipmapped moderngl texture (RGBA8 sRGB, glGenerateMipmap) and a plain sampler2D shader with the
terrain's lighting and fog, at the largest size that fits here (quick: 4096^2; full: up to 16384^2);
time to first frame, VRAM (w * h * 4 * 4/3) and mean frame time over the flythrough's first frames
(4x anisotropic like vt_sample's taps, and trilinear only: llvmpipe's anisotropic filtering is slow),
against texstream on the same pack (open + first update + draw; then frames until fully resident).

llvmpipe: the "GPU" is the same two cores as the I/O threads and the render thread; wall-clock
figures are of this machine, the frame-clock ones are the paths' demand.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import moderngl
import numpy as np

from ..config import BakeConfig, BudgetConfig, StreamerConfig
from ..errors import BudgetError
from ..pack.format import TexelFormat
from ..pack.reader import PackReader
from ..runtime.feedback_reduce import Wanted
from ..runtime.frame_stats import PHASES  # update()'s phases as the frame records time them
from ..runtime.streamer import Streamer
from ..scene.paths import CameraPath, Pose, named_path
from ..telemetry import Telemetry
from ..units import MIB
from .bench_naive import naive_comparison
from .bench_scene_report import print_scene
from .scene_probes import CONVERGED_DB, Convergence, RefetchWindow
from .scene_rig import DT, FPS, FULL, QUICK, Mode, Packs, SceneRig

__all__ = ["run_scene_bench"]

log = logging.getLogger(__name__)


REFETCH_WINDOW = 30  # frames: a tile uploaded again this soon after its eviction is a re-fetch
OVERSUBSCRIPTION = 2.0
PATHS = ("flythrough", "whip_pans", "region_cuts", "oversubscribed")
MB = 1_000_000
# Every field of the result (tests check them; `telemetry` only with a telemetry path).
RESULT_FIELDS = (
    "bench",
    "quick",
    "gl_renderer",
    "gl_vendor",
    "gl_version",
    "cpu_count",
    "dt_s",
    "frame_size",
    "converged_db",
    "refetch_window_frames",
    "upload_ceiling",
    "packs_seconds",
    "packs",
    "reference",
    "budget_mb",
    "paths",
    "naive_comparison",
    "gl_error",
    "seconds",
)
PATH_FIELDS = (
    "frames",
    "duration_s",
    "wall_s",
    "fps_wall",  # frame clock: frames * dt; wall: this machine
    "budget_bytes",
    "vram_peak_bytes",
    "vram_peak_fraction",
    "cache_slots",  # cache_slots: unpinned, per pool
    "uploads",
    "upload_bytes",
    "evictions",
    "tiles_per_s",
    "mb_per_s",
    "mb_per_s_peak",  # frame clock (60 fps demand); peak: 0.5 s window
    "tiles_per_s_wall",
    "mb_per_s_wall",
    "ceiling_fraction",
    "ceiling_fraction_peak",
    "ceiling_fraction_wall",  # MB/s over the ceiling's MB/s
    "update_ms_p50",
    "update_ms_p95",
    "update_ms_p99",
    "update_ms_max",
    "update_ms_max_after_1s",
    "streaming_frames",  # frames that uploaded or requested tiles; their update() ms below
    "streaming_update_ms",  # p50, p95, p99, max
    "phases_ms",  # mean ms per update() phase (FrameStats), on streaming and on idle frames
    "update_cpu_ms_p50",
    "update_cpu_ms_p95",
    "feedback_age_p50",  # frames between a draw and the update() that read its feedback
    "feedback_age_p95",
    "compacted_frames",  # frames whose feedback buffer was compacted on the GPU (it runs while it pays)
    "gpu_ms_p50",
    "latency_samples",
    "latency_p50_frames",
    "latency_p95_frames",
    "latency_p99_frames",
    "refetches",
    "refetch_rate",  # re-uploads within REFETCH_WINDOW frames of the eviction, / uploads
    "refetches_any",
    "refetch_fraction_any",  # Telemetry's: any re-upload of a tile resident before
    "max_mip_bias",
    "final_mip_bias",
    "pressure_peak",  # pressure: unbiased working set / unpinned slots
    "max_missing_pages",
    "final_missing_pages",
    "failed",
    "ring_stalls",
    "telemetry_lines",
)
CUTS_FIELDS = (  # region_cuts
    "cuts",
    "converged_all",
    "converge_frames_max",
    "converge_frames_mean",
    "converge_frames_p95",
    "settle_frames_max",  # settle: frames until the feedback drawn after the cut finds nothing missing
    "settle_frames_mean",
    "settle_frames_p95",
)
CUT_FIELDS = (
    "cut_time_s",
    "frame",
    "hold_frames",
    "frames_to_converge",
    "psnr_first_db",
    "psnr_converged_db",
    "settle_frames",
)
OVERSUBSCRIBED_FIELDS = ("working_set_tiles", "working_set_samples", "oversubscription", "oversubscription_by_pool")
COMPARISON_FIELDS = ("size", "attempts", "naive", "texstream", "first_frame_speedup", "vram_ratio", "frame_time_ratio")
NAIVE_FIELDS = (
    "size",
    "png_bytes",
    "texture_format",
    "anisotropy",
    "load_s",
    "program_s",
    "upload_s",
    "mipmaps_s",
    "first_draw_s",
    "first_frame_s",
    "vram_bytes",
    "frames",
    "frame_ms_mean",
    "frame_ms_mean_trilinear",
)
TEXSTREAM_FIELDS = (
    "pack",
    "size",
    "open_s",
    "first_frame_s",
    "settle_frames",
    "settle_s",
    "budget_bytes",
    "vram_peak_bytes",
    "frames",
    "frame_ms_mean",
)


def _make_packs(mode: Mode, folder: Path) -> Packs:
    if mode.quick:
        from ..bake.pipeline import bake_procedural

        albedo, normals = folder / "terrain-4096-bc1-t128.tpk", folder / "normals-2048-bc5-t128.tpk"
        bake_procedural(albedo, 4096, "terrain", 1, BakeConfig(tile_size=128, progress=False))
        bake_procedural(
            normals, 2048, "normals", 1, BakeConfig(texel_format=TexelFormat.BC5, tile_size=128, progress=False)
        )
        return Packs(albedo, normals)
    from .assets import DEFAULT_NORMALS, DEFAULT_TERRAIN, ensure_asset

    return Packs(ensure_asset(DEFAULT_TERRAIN, progress=False), ensure_asset(DEFAULT_NORMALS, progress=False))


def _pack_info(path: Path) -> dict:
    with PackReader(path) as r:
        h = r.header
        return {
            "file": path.name,
            "size": [h.width, h.height],
            "format": h.texel_format.name.lower(),
            "srgb": bool(h.srgb),
            "tile": h.tile_size,
            "levels": h.level_count,
            "tiles": h.tile_count,
            "all_resident_bytes": h.tile_count * h.tile_raw_size,
        }


def _pool_working_set(streamer: Streamer, wanted: Wanted) -> dict[str, int]:
    """Per pool: distinct unpinned tiles `wanted` samples plus their parents (trilinear reads both),
    as the budget controller counts them (Streamer.pressure)."""
    return {name: need for name, (need, _cap) in streamer.pressure(wanted).items()}


def _pool_slots(streamer: Streamer) -> dict[str, int]:
    """Cache slots per pool besides those pinned for the coarsest levels."""
    return {name: cap for name, (_need, cap) in streamer.pressure(Wanted.empty()).items()}


class _Reference:
    """Every tile of both packs resident (make_all_resident) in a second Streamer: the reference
    frames for convergence, and the working set of a pose without any budget pressure."""

    def __init__(self, ctx: moderngl.Context, packs: Packs, size: tuple[int, int]) -> None:
        budget = _reference_budget_mb(packs)
        t0 = time.perf_counter()
        for attempt in range(4):
            rig = SceneRig(ctx, packs, size, budget)
            try:
                rig.streamer.make_all_resident(rig.albedo)
                assert rig.normals is not None
                rig.streamer.make_all_resident(rig.normals)
                break
            except BudgetError:
                rig.release()
                if attempt == 3:
                    raise
                budget *= 1.5
        self.rig = rig
        self.seconds = time.perf_counter() - t0
        self.budget_mb = budget
        self.streamer = rig.streamer
        self.streamer.update()
        self._images: dict[bytes, np.ndarray] = {}

    def image(self, pose: Pose) -> np.ndarray:
        key = pose.eye.tobytes() + pose.target.tobytes()
        img = self._images.get(key)
        if img is None:
            self.streamer.update()
            self.rig.draw(pose)
            img = self._images[key] = self.rig.read().copy()
        return img

    def working_set(self, pose: Pose, frames: int = 3) -> dict[str, int]:
        """Working set per pool named by the feedback of `frames` draws of `pose` (the feedback
        samples one fragment per 8x8 cell, in a phase that moves each frame: the union of a few
        frames is closer to every tile the view samples than one frame's)."""
        s = self.streamer
        self.rig.ctx.finish()
        s.update()
        s.update()  # every earlier draw's feedback collected
        parts: list[Wanted] = []
        seen = s.sampled_pages
        for i in range(frames + 2):
            if i < frames:
                self.rig.draw(pose)
            else:
                self.rig.ctx.finish()
            s.update()
            if s.sampled_pages is not seen:
                seen = s.sampled_pages
                parts.append(seen)
        ids = np.unique(np.concatenate([p.ids for p in parts] or [np.zeros(0, np.int64)]))
        return _pool_working_set(s, Wanted(ids, np.ones(ids.size, np.int64)))

    def release(self) -> None:
        self.rig.release()
        self._images.clear()


def _reference_budget_mb(packs: Packs) -> float:
    """A budget whose pools hold every tile: the pools share the budget in proportion to level-0
    tile counts, so the pool needing the most per share sets it; plus ring, feedback, slack."""
    headers = []
    for p in (packs.albedo, packs.normals):
        with PackReader(p) as r:
            headers.append(r.header)
    weights = [h.tiles_in_level(0)[0] * h.tiles_in_level(0)[1] for h in headers]
    need = max(h.tile_count * h.tile_raw_size * sum(weights) / w for h, w in zip(headers, weights, strict=True))
    return (need * 1.05 + 112 * MIB) / MIB


def _spread(values: np.ndarray) -> dict[str, float | None]:
    """p50, p95, p99 and max of `values` (None each when empty)."""
    if not values.size:
        return dict.fromkeys(("p50", "p95", "p99", "max"))
    p50, p95, p99 = (float(v) for v in np.percentile(values, [50, 95, 99]))
    return {"p50": p50, "p95": p95, "p99": p99, "max": float(values.max())}


class _Settle:
    """Per cut of a path: frames from the cut frame (0) until a frame whose feedback was drawn after
    the cut finds nothing missing (every page it wants resident at its level)."""

    def __init__(self, path: CameraPath) -> None:
        self.starts = [math.ceil(t * FPS - 1e-9) for t in path.cut_times()]
        self.ends = (self.starts[1:] + [path.frames(FPS)]) if self.starts else []
        self.cut_update: dict[int, int] = {}  # cut index -> streamer frame of the update before its first draw
        self.settled: dict[int, int] = {}

    def frame(self, i: int, rec: Any) -> None:  # noqa: ANN401 (a FrameRecord)
        for k, (a, b) in enumerate(zip(self.starts, self.ends, strict=True)):
            if not a <= i < b or k in self.settled:
                continue
            first = self.cut_update.setdefault(k, rec.frame)
            fresh = rec.feedback_age >= 0 and rec.frame - rec.feedback_age >= first
            if fresh and rec.wanted_pages and rec.missing_pages == 0:
                self.settled[k] = i - a

    def frames_to_settle(self) -> list[int | None]:
        return [self.settled.get(k) for k in range(len(self.starts))]


# ---- one path ---------------------------------------------------------------------------------------
def run_path(
    ctx: moderngl.Context,
    packs: Packs,
    mode: Mode,
    path: CameraPath,
    budget_mb: float,
    ceiling: dict,
    reference: _Reference | None = None,
    jsonl: IO[str] | None = None,
) -> dict:
    """Play `path` on a fresh Streamer at `budget_mb`; the path's figures (see the module docstring)."""
    rig = SceneRig(ctx, packs, mode.frame_size, budget_mb)
    telemetry = Telemetry(rig.streamer, dt=DT)
    conv: Convergence | None = None
    try:
        if reference is not None and path.cut_times():
            conv = Convergence(ctx, path, reference, mode.frame_size)
        s = rig.streamer
        refetch = RefetchWindow(s, REFETCH_WINDOW)
        frames = path.frames(FPS)
        cpu_ms = np.zeros(frames)
        update_ms = np.zeros(frames)
        streaming = np.zeros(frames, bool)
        phases = np.zeros((frames, len(PHASES)))
        feedback_age = np.full(frames, -1)
        compacted = 0
        settle = _Settle(path)
        mb_s_peak = pressure_peak = 0.0
        lines = 0
        throttle = s.gl.throttle(2)  # a swap chain's frames in flight: headless has none
        ctx.finish()
        t0 = time.perf_counter()
        for i in range(frames):
            pose = path.pose(i * DT)
            rec = telemetry.update()
            cpu_ms[i], update_ms[i] = s.last.update_cpu_ms, rec.update_ms
            streaming[i] = bool(rec.uploads or rec.requested)
            phases[i] = [getattr(rec, p) for p in PHASES]
            feedback_age[i], compacted = rec.feedback_age, compacted + s.feedback_info().compacted
            settle.frame(i, rec)
            telemetry.gpu_begin()
            rig.draw(pose)
            telemetry.gpu_end()
            throttle.frame_done()
            if rec.uploads or rec.evicted:
                refetch.check(i)
            mb_s_peak = max(mb_s_peak, rec.upload_mb_s)
            pressure_peak = max([pressure_peak] + [n / c for n, c in s.pressure(s.sampled_pages).values()])
            if conv is not None:
                conv.after_draw(i, pose, rig.fbo)
            if jsonl is not None:
                jsonl.write(json.dumps(rec.as_dict(), separators=(",", ":"), allow_nan=False) + "\n")
                lines += 1
        ctx.finish()
        throttle.release()
        wall = time.perf_counter() - t0
        if conv is not None:
            conv.finish()
        sm = telemetry.summary()
        seconds = frames * DT
        ceil_mb_s = ceiling["mb_per_s"]
        out = {
            "frames": frames,
            "duration_s": seconds,
            "wall_s": wall,
            "fps_wall": frames / wall,
            "budget_bytes": sm["budget_bytes"],
            "vram_peak_bytes": sm["vram_peak_bytes"],
            "vram_peak_fraction": sm["vram_peak_fraction"],
            "cache_slots": _pool_slots(s),
            "uploads": sm["uploads"],
            "upload_bytes": sm["upload_bytes"],
            "evictions": sm["evictions"],
            "tiles_per_s": sm["uploads"] / seconds,
            "mb_per_s": sm["upload_bytes"] / MB / seconds,
            "mb_per_s_peak": mb_s_peak,
            "tiles_per_s_wall": sm["uploads"] / wall,
            "mb_per_s_wall": sm["upload_bytes"] / MB / wall,
            "ceiling_fraction": sm["upload_bytes"] / MB / seconds / ceil_mb_s,
            "ceiling_fraction_peak": mb_s_peak / ceil_mb_s,
            "ceiling_fraction_wall": sm["upload_bytes"] / MB / wall / ceil_mb_s,
            "update_ms_p50": sm["update_ms_p50"],
            "update_ms_p95": sm["update_ms_p95"],
            "update_ms_p99": float(np.percentile(update_ms, 99)),
            "update_ms_max": float(update_ms.max()),
            "update_ms_max_after_1s": float(update_ms[int(FPS) :].max() if frames > FPS else update_ms.max()),
            "streaming_frames": int(np.count_nonzero(streaming)),
            "streaming_update_ms": _spread(update_ms[streaming]),
            "phases_ms": {
                kind: {p: float(phases[sel, k].mean()) if sel.any() else 0.0 for k, p in enumerate(PHASES)}
                for kind, sel in (("streaming", streaming), ("idle", ~streaming))
            },
            "update_cpu_ms_p50": float(np.percentile(cpu_ms, 50)),
            "update_cpu_ms_p95": float(np.percentile(cpu_ms, 95)),
            "feedback_age_p50": float(np.percentile(feedback_age[feedback_age >= 0], 50)),
            "feedback_age_p95": float(np.percentile(feedback_age[feedback_age >= 0], 95)),
            "compacted_frames": int(compacted),
            "gpu_ms_p50": sm["gpu_ms_p50"],
            "latency_samples": sm["latency_samples"],
            "latency_p50_frames": sm["latency_p50_frames"],
            "latency_p95_frames": sm["latency_p95_frames"],
            "latency_p99_frames": sm["latency_p99_frames"],
            "refetches": refetch.count,
            "refetch_rate": refetch.count / sm["uploads"] if sm["uploads"] else 0.0,
            "refetches_any": sm["refetches"],
            "refetch_fraction_any": sm["refetch_fraction"],
            "max_mip_bias": sm["max_mip_bias"],
            "final_mip_bias": sm["final_mip_bias"],
            "pressure_peak": pressure_peak,
            "max_missing_pages": sm["max_missing_pages"],
            "final_missing_pages": sm["final_missing_pages"],
            "failed": sm["failed"],
            "ring_stalls": sm["ring_stalls"],
            "telemetry_lines": lines,
        }
        if conv is not None:
            got = [c["frames_to_converge"] for c in conv.cuts]
            out["cuts"] = conv.cuts
            out["converged_all"] = all(g is not None for g in got)
            ok = [g for g in got if g is not None]
            out["converge_frames_max"] = max(ok) if ok else None
            out["converge_frames_mean"] = float(np.mean(ok)) if ok else None
            out["converge_frames_p95"] = float(np.percentile(ok, 95)) if ok else None
            for c, n in zip(conv.cuts, settle.frames_to_settle(), strict=True):
                c["settle_frames"] = n
            done = [c["settle_frames"] for c in conv.cuts if c["settle_frames"] is not None]
            out["settle_frames_max"] = max(done) if done else None
            out["settle_frames_mean"] = float(np.mean(done)) if done else None
            out["settle_frames_p95"] = float(np.percentile(done, 95)) if done else None
        assert set(PATH_FIELDS) <= set(out), set(PATH_FIELDS) - set(out)
        return out
    finally:
        if conv is not None:
            conv.grabber.release()
        telemetry.release()
        rig.release()


# ---- the oversubscribed budget ------------------------------------------------------------------------
def _oversubscribed_budget(ctx: moderngl.Context, packs: Packs, working_set: dict[str, int], start_mb: float) -> float:
    """The smallest budget (bisection to 2 %) at which every pool's unpinned slots hold at least
    1/OVERSUBSCRIPTION of its working set: the most loaded pool is then oversubscribed ~2x."""

    def slots(mb: float) -> dict[str, int] | None:
        try:
            with Streamer(ctx, StreamerConfig(budget=BudgetConfig(budget_mb=mb))) as s:
                s.open(packs.albedo)
                s.open(packs.normals)
                return _pool_slots(s)
        except BudgetError:
            return None

    def ratio(got: dict[str, int] | None) -> float:
        if got is None:
            return math.inf
        return max(working_set[k] / max(1, got[k]) for k in working_set)

    hi = start_mb
    while ratio(slots(hi)) > OVERSUBSCRIPTION:
        hi *= 2
    lo = hi / 256
    while hi / lo > 1.02:
        mid = math.sqrt(lo * hi)
        if ratio(slots(mid)) > OVERSUBSCRIPTION:
            lo = mid
        else:
            hi = mid
    return hi


# ---- the run ----------------------------------------------------------------------------------------
def run_scene_bench(quick: bool, json_path: str | None, telemetry_path: str | None = None) -> dict:
    """Run the scene benchmark on a fresh headless context; print a table; write the results as JSON
    to `json_path` and every path's frame records (FRAME_SCHEMA, one a line, paths in order; the
    result's `telemetry` names each path's line range) to `telemetry_path` when given."""
    from ..gl.context import headless_context
    from .bench_upload import upload_ceiling

    mode = QUICK if quick else FULL
    t_start = time.perf_counter()
    ctx = headless_context()
    jsonl = Path(telemetry_path).open("w", encoding="utf-8", newline="\n") if telemetry_path else None
    try:
        info = ctx.info
        result: dict = {
            "bench": "scene",
            "quick": quick,
            "gl_renderer": info.get("GL_RENDERER", "?"),
            "gl_vendor": info.get("GL_VENDOR", "?"),
            "gl_version": info.get("GL_VERSION", "?"),
            "cpu_count": os.cpu_count(),
            "dt_s": DT,
            "frame_size": list(mode.frame_size),
            "converged_db": CONVERGED_DB,
            "refetch_window_frames": REFETCH_WINDOW,
        }
        up = upload_ceiling(ctx, mode.ceiling_tiles)
        up["mb_per_s"] = up["tiles_per_s"] * up["tile_bytes"] / MB
        result["upload_ceiling"] = up
        with tempfile.TemporaryDirectory(prefix="texstream-bench-scene-") as tmp:
            folder = Path(tmp)
            t0 = time.perf_counter()
            packs = _make_packs(mode, folder)
            result["packs_seconds"] = time.perf_counter() - t0
            result["packs"] = {"albedo": _pack_info(packs.albedo), "normals": _pack_info(packs.normals)}
            with PackReader(packs.albedo) as r:
                w, h = r.header.width, r.header.height
            reference = _Reference(ctx, packs, mode.frame_size)
            try:
                result["reference"] = {
                    "budget_bytes": reference.streamer.budget.budget,
                    "make_all_resident_s": reference.seconds,
                }
                # The oversubscribed path's working set, then its budget.
                over = named_path("oversubscribed", w, h)
                ws: dict[str, int] = {}
                for f in range(0, over.frames(FPS), mode.ws_stride):
                    for k, v in reference.working_set(over.pose(f * DT)).items():
                        ws[k] = max(ws.get(k, 0), v)
                over_mb = _oversubscribed_budget(ctx, packs, ws, mode.budget_mb)
                budgets = {name: mode.budget_mb for name in PATHS}
                budgets["oversubscribed"] = over_mb
                result["budget_mb"] = mode.budget_mb
                result["paths"] = {}
                index = {}
                line = 1
                for name in PATHS:
                    log.info("bench scene: %s", name)
                    r = run_path(
                        ctx,
                        packs,
                        mode,
                        named_path(name, w, h),
                        budgets[name],
                        up,
                        reference=reference if name == "region_cuts" else None,
                        jsonl=jsonl,
                    )
                    index[name] = {"first_line": line, "lines": r["telemetry_lines"]}
                    line += r["telemetry_lines"]
                    result["paths"][name] = r
                o = result["paths"]["oversubscribed"]
                o["working_set_tiles"] = ws
                o["working_set_samples"] = len(range(0, over.frames(FPS), mode.ws_stride))
                o["oversubscription_by_pool"] = {k: ws[k] / max(1, o["cache_slots"][k]) for k in ws}
                o["oversubscription"] = max(o["oversubscription_by_pool"].values())  # the controller's view
            finally:
                reference.release()

            result["naive_comparison"] = naive_comparison(ctx, mode, packs, folder)
        if telemetry_path:
            result["telemetry"] = {"path": str(telemetry_path), "lines": index}
        result["gl_error"] = ctx.error  # GL_NO_ERROR: nothing the run did left an error behind
        result["seconds"] = time.perf_counter() - t_start
    finally:
        if jsonl is not None:
            jsonl.close()
        ctx.release()
    print_scene(result)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result
