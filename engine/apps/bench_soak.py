"""`texstream bench soak`: a long run that looks for leaks and broken invariants, not speed.

It drives one streamer the way a long-running game does: random camera cuts and pans over several
textures, budget changes, textures closed and opened again. Per window of frames it records the
process's resident memory, live GL objects (the driver's answer, `GLExt.live_objects`), threads,
open file descriptors, the engine's VRAM against its budget, and a convergence check: the camera
holds still on one texture until nothing is missing and the frame is compared with an all-resident
reference (PSNR). At the end the streamer is released and the context must hold exactly the GL objects
it held before.

RSS growth is reported as the least-squares slope of RSS over the windows after the first (warm-up),
in MiB per 1000 frames, each window measured with the budget set back to its base value (budget
changes happen inside windows): on a software renderer GPU memory is host memory.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import moderngl
import numpy as np

from ..config import BakeConfig, BudgetConfig, StreamerConfig
from ..gl.gl_ext import GLExt
from ..pack.format import TexelFormat
from ..runtime.streamer import Streamer, VirtualTexture
from ..scene.camera import View
from ..testing.images import psnr
from .render import PlaneRenderer

__all__ = ["SoakReport", "SoakWindow", "make_soak_packs", "print_soak", "run_soak"]

CHECK_DB = 45.0  # every convergence check must reach this against the all-resident frame
BASE_BUDGET_MB = 16.0  # the streamer's budget at the start and whenever a window is measured


@dataclass
class SoakWindow:
    """One window of frames."""

    frames: int  # frames run so far
    rss_mib: float
    gl_objects: int  # live GL objects in the context (all kinds)
    threads: int
    fds: int
    vram_peak_ratio: float  # highest engine VRAM usage / budget in the window
    budget_mib: float  # the budget at the window's end, before it is set back to the base for measuring
    open_textures: int
    uploads: int  # tiles uploaded in the window
    check_db: float  # convergence check of the window (PSNR against all-resident)
    check_frames: int  # frames the check needed to converge
    python_objects: int  # objects the garbage collector tracks (a per-frame leak of any object shows here)


@dataclass
class SoakReport:
    frames: int
    seconds: float
    windows: list[SoakWindow] = field(default_factory=list)
    rss_slope_mib_per_1000: float = 0.0  # after the first window
    gl_objects_left: dict[str, int] = field(default_factory=dict)  # after release(), vs before
    budget_violations: int = 0  # frames whose engine VRAM exceeded the budget
    min_check_db: float = 0.0
    opened: int = 0
    closed: int = 0
    budget_changes: int = 0

    def problems(self, max_slope: float = 0.2, max_object_growth: int = 500) -> list[str]:
        """What broke, one line each (empty: the soak passed)."""
        out = []
        if self.rss_slope_mib_per_1000 > max_slope:
            out.append(f"RSS grows {self.rss_slope_mib_per_1000:.3f} MiB per 1000 frames (limit {max_slope})")
        if len(self.windows) >= 2:
            grown = self.windows[-1].python_objects - self.windows[1 if len(self.windows) > 2 else 0].python_objects
            if grown > max_object_growth:
                out.append(f"{grown} more Python objects after warm-up (limit {max_object_growth})")
        if self.gl_objects_left:
            out.append(f"GL objects left after release(): {self.gl_objects_left}")
        if self.budget_violations:
            out.append(f"VRAM over budget in {self.budget_violations} frames")
        if self.windows and self.min_check_db < CHECK_DB:
            out.append(f"a convergence check reached {self.min_check_db:.1f} dB (needs {CHECK_DB})")
        threads = {w.threads for w in self.windows}
        if len(threads) > 1:
            out.append(f"thread count changed across windows: {sorted(threads)}")
        fds: dict[int, set[int]] = {}  # by open textures: each holds its descriptors
        for w in self.windows:
            fds.setdefault(w.open_textures, set()).add(w.fds)
        changed = {k: sorted(v) for k, v in fds.items() if len(v) > 1}
        if changed:
            out.append(f"open file descriptors changed across windows with as many textures open: {changed}")
        return out

    def as_dict(self) -> dict:
        return asdict(self)


def make_soak_packs(folder: Path, quick: bool) -> list[Path]:
    """Three procedural packs of two formats (baked once into `folder`)."""
    from ..bake.pipeline import bake_procedural

    size = 1024 if quick else 4096
    specs = [
        ("terrain.tpk", size, "terrain", TexelFormat.BC1),
        ("normals.tpk", size // 2, "normals", TexelFormat.BC5),
        ("checker.tpk", size, "checker", TexelFormat.BC1),
    ]
    out = []
    for name, n, pattern, fmt in specs:
        path = folder / name
        if not path.exists():
            bake_procedural(path, n, pattern, 7, BakeConfig(texel_format=fmt, tile_size=64, jobs=1, progress=False))
        out.append(path)
    return out


def _trim_heap() -> None:
    """Hand freed heap pages back to the system (glibc's malloc_trim) so RSS shows memory in use, not
    what the allocator keeps cached after a pool resize; a no-op elsewhere."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


class _Soak:
    def __init__(self, ctx: moderngl.Context, packs: list[Path], size: tuple[int, int], seed: int) -> None:
        self.ctx, self.packs, self.size = ctx, packs, size
        self.rng = np.random.default_rng(seed)
        self.budgets = (6.0, 24.0)  # MiB: the smallest still holds a checked view at full detail
        cfg = StreamerConfig(budget=BudgetConfig(budget_mb=BASE_BUDGET_MB), io_threads=2, ring_mb=2)
        self.streamer = Streamer(ctx, cfg)
        self.renderer = PlaneRenderer(ctx, size)
        self.throttle = self.streamer.gl.throttle(2)
        self.open: dict[Path, VirtualTexture] = {p: self.streamer.open(p) for p in packs}
        self.views = {p: self._random_view() for p in packs}
        self.velocity = {p: np.zeros(2) for p in packs}
        # The all-resident reference: a second streamer holding every tile of every pack, made once
        # (a streamer made per check would measure the allocator's churn, not the streamer under test).
        ref_cfg = StreamerConfig(budget=BudgetConfig(budget_mb=256.0), io_threads=1, ring_mb=2)
        self.reference = Streamer(ctx, ref_cfg)
        self.reference_textures = {p: self.reference.open(p) for p in packs}
        for vt in self.reference_textures.values():
            self.reference.make_all_resident(vt)
        self.frame = 0
        self.peak_ratio = 0.0
        self.violations = 0
        self.uploads = 0
        self.opened = len(packs)
        self.closed = 0
        self.budget_changes = 0

    def _random_view(self) -> View:
        r = self.rng
        tilt = float(r.choice([0.0, 0.0, 45.0, 65.0]))
        return View(
            float(r.uniform(0.1, 0.9)),
            float(r.uniform(0.1, 0.9)),
            float(2 ** r.uniform(-2, 1.5)),
            tilt,
            float(r.uniform(0, 360)),
        )

    def step(self) -> None:
        """One frame: update, then draw every open texture from its moving camera."""
        s = self.streamer
        st = s.update()
        self.frame += 1
        self.uploads += st.uploads
        ratio = s.budget.usage / s.budget.budget
        self.peak_ratio = max(self.peak_ratio, ratio)
        self.violations += ratio > 1.0
        for path, vt in self.open.items():
            v = self.views[path]
            if self.rng.random() < 0.01:  # a camera cut
                self.views[path] = self._random_view()
                continue
            self.velocity[path] = 0.9 * self.velocity[path] + self.rng.normal(0, 0.0008, 2)
            cx, cy = np.clip([v.cx, v.cy] + self.velocity[path], 0.05, 0.95)
            self.views[path] = View(float(cx), float(cy), v.zoom, v.tilt, v.yaw)
            self.renderer.draw(vt, self.views[path])
        self.throttle.frame_done()

    def events(self) -> None:
        """Budget changes and textures closed and opened again, at random moments."""
        r = self.rng
        if r.random() < 1 / 400:
            self.streamer.set_budget(float(r.uniform(*self.budgets)))
            self.budget_changes += 1
        if r.random() < 1 / 300 and len(self.open) > 1:
            path = list(self.open)[int(r.integers(len(self.open)))]
            self.streamer.close(self.open.pop(path))
            self.closed += 1
        if r.random() < 1 / 150:
            missing = [p for p in self.packs if p not in self.open]
            if missing:
                path = missing[int(r.integers(len(missing)))]
                self.open[path] = self.streamer.open(path)
                self.views[path] = self._random_view()
                self.opened += 1

    def check(self, max_frames: int = 240) -> tuple[float, int]:
        """Hold one texture's camera still until nothing is missing; PSNR against all-resident."""
        path = list(self.open)[int(self.rng.integers(len(self.open)))]
        vt = self.open[path]
        view = View(self.views[path].cx, self.views[path].cy, max(self.views[path].zoom, 0.5), 0.0, 0.0)
        s = self.streamer
        settled = 0
        n = 0
        for n in range(1, max_frames + 1):  # noqa: B007
            st = s.update()
            self.frame += 1
            self.renderer.draw(vt, view)
            self.throttle.frame_done()
            settled = settled + 1 if (st.missing_pages == 0 and not s.busy and st.feedback_age >= 0) else 0
            if settled >= 4:
                break
        frame = self.renderer.read()
        self.reference.update()
        self.renderer.draw(self.reference_textures[path], view)
        return psnr(frame, self.renderer.read()), n

    def release(self) -> None:
        self.throttle.release()
        self.renderer.release()
        self.streamer.release()
        self.reference.release()


def run_soak(
    ctx: moderngl.Context,
    packs: list[Path],
    *,
    frames: int,
    window: int = 1000,
    size: tuple[int, int] = (256, 256),
    seed: int = 1,
    progress: bool = False,
) -> SoakReport:
    """Run `frames` frames in windows of `window`; see the module docstring."""
    gl = GLExt(ctx)
    gc.collect()
    before = gl.live_objects()
    soak = _Soak(ctx, packs, size, seed)
    report = SoakReport(frames=0, seconds=0.0)
    t0 = time.perf_counter()
    try:
        while soak.frame < frames:
            start_uploads = soak.uploads
            soak.peak_ratio = 0.0
            end = min(frames, soak.frame + window)
            while soak.frame < end:
                soak.step()
                soak.events()
            # Measured at the base budget: on a software renderer (llvmpipe) VRAM is host memory, so
            # RSS is comparable across windows only with the pools at the same size.
            budget_mib = soak.streamer.budget.budget / 2**20
            soak.streamer.set_budget(BASE_BUDGET_MB)
            db, needed = soak.check()
            gc.collect()
            _trim_heap()
            report.windows.append(
                SoakWindow(
                    frames=soak.frame,
                    rss_mib=_rss_mib(),
                    gl_objects=gl.live_objects().total,
                    threads=threading.active_count(),
                    fds=_fd_count(),
                    vram_peak_ratio=soak.peak_ratio,
                    budget_mib=budget_mib,
                    open_textures=len(soak.open),
                    uploads=soak.uploads - start_uploads,
                    check_db=db,
                    check_frames=needed,
                    python_objects=len(gc.get_objects()),
                )
            )
            if progress:
                w = report.windows[-1]
                print(
                    f"  {w.frames:>7} frames  RSS {w.rss_mib:7.1f} MiB  GL objects {w.gl_objects:4d}  "
                    f"threads {w.threads}  fds {w.fds}  check {w.check_db:5.1f} dB",
                    flush=True,
                )
    finally:
        soak.release()
    gc.collect()
    report.gl_objects_left = gl.live_objects().minus(before)
    report.frames = soak.frame
    report.seconds = time.perf_counter() - t0
    report.budget_violations = soak.violations
    report.opened, report.closed, report.budget_changes = soak.opened, soak.closed, soak.budget_changes
    report.min_check_db = min((w.check_db for w in report.windows), default=0.0)
    tail = report.windows[1:]
    if len(tail) >= 2:
        x = np.array([w.frames for w in tail], np.float64)
        y = np.array([w.rss_mib for w in tail], np.float64)
        report.rss_slope_mib_per_1000 = float(np.polyfit(x, y, 1)[0] * 1000.0)
    return report


def print_soak(report: SoakReport) -> None:
    print(
        f"soak: {report.frames} frames in {report.seconds:.0f} s; {report.opened} opens, {report.closed} closes, "
        f"{report.budget_changes} budget changes"
    )
    print(
        "| frames | RSS MiB | Python objects | GL objects | threads | fds | textures | VRAM peak / budget "
        "| budget MiB | uploads | check dB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for w in report.windows:
        print(
            f"| {w.frames} | {w.rss_mib:.1f} | {w.python_objects} | {w.gl_objects} | {w.threads} | {w.fds} "
            f"| {w.open_textures} | {w.vram_peak_ratio:.3f} | {w.budget_mib:.1f} | {w.uploads} "
            f"| {w.check_db:.1f} |"
        )
    print(f"RSS growth after warm-up: {report.rss_slope_mib_per_1000:+.3f} MiB per 1000 frames")
    print(f"GL objects left after release(): {report.gl_objects_left or 'none'}")
    problems = report.problems()
    print("soak passed" if not problems else "soak FAILED: " + "; ".join(problems))


def run_soak_bench(minutes: float | None, quick: bool, json_path: str | None) -> int:
    """The CLI's `bench soak`: frames until `minutes` have passed (or a fixed count with --quick)."""
    from ..gl.context import headless_context

    ctx = headless_context()
    with tempfile.TemporaryDirectory(prefix="texstream-soak-") as tmp:
        packs = make_soak_packs(Path(tmp), quick)
        if minutes is None:
            frames = 3000 if quick else 20000
        else:  # a calibration window sets the frame count for the wanted duration
            probe = run_soak(ctx, packs, frames=300, window=300)
            frames = max(2000, int(minutes * 60 / (probe.seconds / probe.frames)))
        report = run_soak(ctx, packs, frames=frames, progress=True)
    print_soak(report)
    if json_path:
        Path(json_path).write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    return 1 if report.problems() else 0
