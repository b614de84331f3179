"""`texstream demo`: huge textures streamed inside a small VRAM budget, in one of three scenes.

terrain  (default) a flight low over a 32768^2 terrain colour map and its normal map (or the packs
         given on the command line).
gallery  a field of canvases (128 by default), each with its own procedural texture (4096^2 by
         default; baked once into the cache), all streaming through one budget.
scene    a flight around a glTF file's scene, or a built-in one of several materials (demo_scene.py).

With a display, a GLFW window: the scripted flight plays first (the screen says so); Space, the
movement keys or the right mouse button hand the camera over: mouse look (hold the right button)
and WASD (Q/E down/up, Shift faster); Space replays the flight, H toggles the overlay, M colours by
resident mip level, R colours by residency (green: wanted level resident, yellow: one level coarser,
red: more), F freezes feedback, + / - raise or lower the budget by 25 %, P writes a screenshot, Esc
quits.

Without a display (or with --headless) it renders the flight through EGL: `--frames` frames spread
evenly over `--seconds` of it (default: the whole flight), and writes the PNG frames, the per-frame
telemetry (JSONL), the run summary (JSON) and the run report (`run.json`: update() percentiles,
frame rate, VRAM against the budget, texels streamed) into --out; the report is printed too.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import moderngl
import numpy as np

from ..config import BudgetConfig, StreamerConfig, cache_dir
from ..errors import EngineError
from ..pack.extract import write_image
from ..pack.format import TexelFormat
from ..pack.writer import create_temp, output_mode
from ..runtime.streamer import Streamer, VirtualTexture
from ..runtime.tiles import MAX_TEXTURES
from ..scene.gallery import GalleryLayout, GalleryScene, gallery_flight
from ..scene.paths import DEMO_WAYPOINTS, FLYTHROUGH_WAYPOINTS, CameraPath, Pose, flythrough
from ..scene.terrain import TerrainScene, sky_clear_colour
from ..telemetry import FrameRecord, Overlay, Telemetry, memory_summary
from .assets import DEFAULT_NORMALS, DEFAULT_TERRAIN, ensure_asset, ensure_gallery

log = logging.getLogger(__name__)

FPS = 60.0
MAX_SIZE = 16384  # a side: GL_MAX_RENDERBUFFER_SIZE / GL_MAX_VIEWPORT_DIMS on common drivers
SCENES = ("terrain", "gallery", "scene")  # scene: a glTF file, or the built-in one (demo_scene.py)
FLIGHT_SECONDS = 30.0
GALLERY_OBJECTS = 128
GALLERY_TEXTURE_SIZE = 4096  # 128 of them: 2.1 Gtexel, 1.6 GiB of BC1 tiles; about 1.5 minutes to bake on 2 cores
MIN_GALLERY_TEXTURE, MAX_GALLERY_TEXTURE = 256, 16384


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    scene: str = "terrain"
    packs: tuple[str, ...] = ()  # terrain: empty means the built-in terrain colour + normal map
    size: tuple[int, int] = (1280, 720)
    budget_mb: float = 192.0  # far below the 512 MiB + 256 MiB the two default textures would need
    headless: bool = False
    frames: int = 60  # headless frame count
    seconds: float | None = None  # headless: flight time the frames are spread over; None: the whole flight
    out: Path | None = None  # headless output folder
    telemetry: Path | None = None
    overlay: bool = True
    objects: int = GALLERY_OBJECTS  # gallery: canvases, each with its own texture
    texture_size: int = GALLERY_TEXTURE_SIZE  # gallery: texels a side of each texture

    def __post_init__(self) -> None:  # ValueError: the CLI prints it as one line (exit 2)
        if self.scene not in SCENES:
            raise ValueError(f"unknown scene {self.scene!r} (choose from {', '.join(SCENES)})")
        w, h = self.size
        if not (isinstance(w, int) and isinstance(h, int) and 1 <= w <= MAX_SIZE and 1 <= h <= MAX_SIZE):
            raise ValueError(f"frame size {w}x{h} must be within 1..{MAX_SIZE} a side")
        if not (math.isfinite(self.budget_mb) and self.budget_mb > 0):
            raise ValueError(f"budget must be a positive number of MiB, got {self.budget_mb!r}")
        if self.frames < 1:
            raise ValueError(f"frames must be >= 1, got {self.frames!r}")
        if self.seconds is not None and not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"seconds must be a positive number, got {self.seconds!r}")
        if self.scene == "gallery":
            if self.packs:
                raise ValueError("the gallery bakes its own textures: give it no packs (see --objects, --texture-size)")
            if not (isinstance(self.objects, int) and 1 <= self.objects <= MAX_TEXTURES):
                raise ValueError(f"gallery objects must be within 1..{MAX_TEXTURES}, got {self.objects!r}")
            t = self.texture_size
            if not (isinstance(t, int) and MIN_GALLERY_TEXTURE <= t <= MAX_GALLERY_TEXTURE and t & (t - 1) == 0):
                raise ValueError(
                    f"gallery texture size must be a power of two within {MIN_GALLERY_TEXTURE}..{MAX_GALLERY_TEXTURE}, "
                    f"got {t!r}"
                )


def has_display() -> bool:
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def open_textures(
    streamer: Streamer, packs: tuple[str, ...], progress: bool
) -> tuple[VirtualTexture, VirtualTexture | None]:
    if not packs:
        packs = (str(ensure_asset(DEFAULT_TERRAIN, progress)), str(ensure_asset(DEFAULT_NORMALS, progress)))
    albedo = streamer.open(packs[0])
    normals = None
    for extra in packs[1:]:
        vt = streamer.open(extra)
        if vt.header.texel_format is TexelFormat.BC5 and normals is None:
            normals = vt
        else:
            log.warning("%s is not a BC5 normal map: opened (it shares the budget) but not drawn", extra)
    return albedo, normals


class Demo:
    """Scene + streamer + telemetry + overlay; one `frame(pose)` call per frame."""

    def __init__(self, ctx: moderngl.Context, cfg: DemoConfig, progress: bool = True) -> None:
        self.ctx, self.cfg = ctx, cfg
        gallery = (
            ensure_gallery(cfg.objects, cfg.texture_size, progress) if cfg.scene == "gallery" else []
        )  # baked before the streamer holds any GPU memory
        self.streamer = Streamer(ctx, StreamerConfig(budget=BudgetConfig(budget_mb=cfg.budget_mb)))
        self.overlay: Overlay | None = None
        try:
            self.scene: TerrainScene | GalleryScene  # or demo_scene.SceneDemo: the same draw/debug/release
            if cfg.scene == "scene":
                from .demo_scene import scene_and_flight

                self.scene, self.path = scene_and_flight(ctx, self.streamer, cfg.packs, cfg.texture_size, progress)
            elif cfg.scene == "gallery":
                layout = GalleryLayout(cfg.objects)
                self.scene = GalleryScene(ctx, [self.streamer.open(p) for p in gallery], layout)
                self.path: CameraPath = gallery_flight(layout, FLIGHT_SECONDS)
            else:
                albedo, normals = open_textures(self.streamer, cfg.packs, progress)
                self.scene = TerrainScene(ctx, albedo, normals)
                w, h = self.scene.size
                # The built-in terrain gets a path over its land; other packs the generic one.
                waypoints = DEMO_WAYPOINTS if not cfg.packs else FLYTHROUGH_WAYPOINTS
                self.path = flythrough(w, h, altitude=90.0, seconds=FLIGHT_SECONDS, waypoints=waypoints)
            # Headless, the frame clock is the flight's: the frames are spread over the flight.
            self.flight_seconds = cfg.seconds or self.path.duration
            self.frame_dt = self.flight_seconds / cfg.frames if cfg.headless else None
            self.telemetry = Telemetry(self.streamer, dt=self.frame_dt)
            if cfg.telemetry and Path(cfg.telemetry).suffix.lower() == ".csv":
                self.telemetry.write_csv(cfg.telemetry)
            elif cfg.telemetry:
                self.telemetry.write_jsonl(cfg.telemetry)
            # The overlay also writes the window's flight hints, so it exists even when hidden.
            self.overlay = Overlay(ctx) if cfg.overlay or not cfg.headless else None
        except BaseException:
            self.streamer.release()
            raise
        self.show_overlay = cfg.overlay

    def frame(self, pose: Pose, fbo: moderngl.Framebuffer, fb_size: tuple[int, int]) -> FrameRecord:
        """Update the streamer, draw the scene (and the overlay); returns the frame's telemetry record."""
        record = self.telemetry.update()
        fbo.viewport = (0, 0, fb_size[0], fb_size[1])  # the window's may have been resized since
        fbo.use()
        fbo.clear(*sky_clear_colour(), 1.0)
        self.telemetry.gpu_begin()
        self.scene.draw(pose, fb_size)
        self.telemetry.gpu_end()
        if self.overlay is not None and self.show_overlay:
            self.overlay.draw(self.telemetry, fb_size)
        return record

    def close(self) -> str:
        """Release everything; returns the memory summary taken just before."""
        summary = memory_summary(self.streamer)
        if self.overlay is not None:
            self.overlay.release()
        self.telemetry.release()
        self.scene.release()
        self.streamer.release()
        return summary


@dataclass(frozen=True)
class RunReport:
    """What a headless run measured, for `run.json` and the printed report."""

    scene: str
    frames: int
    size: str
    flight_seconds: float
    textures: int
    texels: int  # level 0 of every open texture
    all_resident_bytes: int  # cache bytes of every tile of every texture
    budget_bytes: int
    fps: float  # frames per second of the render loop (update, draw, read back; PNG writing excluded)
    update_ms_p50: float
    update_ms_p95: float
    update_ms_p99: float
    gpu_ms_p50: float | None
    vram_peak_bytes: int
    working_set_peak_bytes: int
    stream_cache_bytes: int
    max_mip_bias: float
    resident_tiles: int
    uploads: int

    def lines(self) -> list[str]:
        mib = 2**20
        gpu = f", GPU p50 {self.gpu_ms_p50:.2f} ms" if self.gpu_ms_p50 is not None else ""
        return [
            f"{self.scene}: {self.textures} textures, {self.texels / 1e9:.2f} Gtexel in all "
            f"({self.all_resident_bytes / 2**30:.2f} GiB of tiles if all resident) in a "
            f"{self.budget_bytes / mib:.1f} MiB budget",
            f"{self.frames} frames at {self.size} over {self.flight_seconds:g} s of flight: {self.fps:.1f} fps "
            "(update + draw + read back; PNG writing excluded)",
            f"update() p50 {self.update_ms_p50:.2f} ms, p95 {self.update_ms_p95:.2f} ms, "
            f"p99 {self.update_ms_p99:.2f} ms{gpu}",
            f"VRAM peak {self.vram_peak_bytes / mib:.1f} of {self.budget_bytes / mib:.1f} MiB; working set peak "
            f"{self.working_set_peak_bytes / mib:.1f} MiB against {self.stream_cache_bytes / mib:.1f} MiB of cache; "
            f"mip bias max {self.max_mip_bias:.2f}",
            f"resident tiles at the end {self.resident_tiles}, uploads {self.uploads}",
        ]


def run_report(demo: Demo, records: list[FrameRecord], loop_seconds: float) -> RunReport:
    st = demo.streamer
    headers = [vt.header for vt in st.textures]
    upd = np.array([r.update_ms for r in records])
    gpu = np.array([r.gpu_ms for r in records if r.gpu_ms is not None])
    p50, p95, p99 = (float(v) for v in np.percentile(upd, [50, 95, 99]))
    last = records[-1]
    return RunReport(
        scene=demo.cfg.scene,
        frames=len(records),
        size="{}x{}".format(*demo.cfg.size),
        flight_seconds=demo.flight_seconds,
        textures=len(headers),
        texels=sum(h.width * h.height for h in headers),
        all_resident_bytes=sum(h.tile_count * h.tile_raw_size for h in headers),
        budget_bytes=int(last.budget_bytes),
        fps=len(records) / loop_seconds if loop_seconds > 0 else 0.0,
        update_ms_p50=p50,
        update_ms_p95=p95,
        update_ms_p99=p99,
        gpu_ms_p50=float(np.percentile(gpu, 50)) if gpu.size else None,
        vram_peak_bytes=int(last.vram_peak_bytes),
        working_set_peak_bytes=max(int(r.working_set_bytes) for r in records),
        stream_cache_bytes=int(last.stream_cache_bytes),
        max_mip_bias=max(float(r.mip_bias) for r in records),
        resident_tiles=int(last.resident_tiles),
        uploads=sum(int(r.uploads) for r in records),
    )


PNG_COMPRESS_LEVEL = (
    1  # zlib level 1: 56 ms a 1280x720 frame against 182 ms at Pillow's default (6), files ~25 % larger
)
FRAME_QUEUE_DEPTH = 8  # frames waiting for the writer: 8 x 3.5 MiB at 1280x720


class FrameWriter:
    """Writes headless frames as PNG files on a thread of its own, so the render loop never waits on zlib.

    Pillow's PNG encoder releases the GIL while it compresses, so frame N is encoded on one core while
    the loop renders frame N+1 on the other. The queue is bounded: a loop that outruns the disk waits
    for a free place rather than holding every frame in memory. Each file is written to a temporary
    name and renamed, so an interrupted run leaves whole frames only. The first write error stops the
    writer; `put` and `close` raise it on the caller's thread as an `EngineError` naming the file.

    Parameters
    ----------
    out : Path
        The folder the frames go to, as ``frame_0000.png``, ``frame_0001.png``, ...
    size : tuple of int
        Width and height of every frame.
    depth : int
        Frames that may wait for the writer before `put` blocks.
    compress_level : int
        zlib level of the PNG files (0-9).
    """

    def __init__(
        self,
        out: Path,
        size: tuple[int, int],
        *,
        depth: int = FRAME_QUEUE_DEPTH,
        compress_level: int = PNG_COMPRESS_LEVEL,
    ) -> None:
        if depth < 1:
            raise ValueError(f"frame queue depth must be >= 1, got {depth!r}")
        if not 0 <= compress_level <= 9:
            raise ValueError(f"PNG compress level must be within 0..9, got {compress_level!r}")
        self.out, self.size, self.compress_level = Path(out), size, compress_level
        self.written = 0  # frames on disk; read after close()
        self._queue: queue.Queue[tuple[int, bytes] | None] = queue.Queue(maxsize=depth)
        self._error: EngineError | None = None  # set by the writer thread only
        self._abandon = threading.Event()  # close(abandon=True): drop what is still queued
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="texstream-frame-writer", daemon=True)
        self._thread.start()

    def path(self, index: int) -> Path:
        return self.out / f"frame_{index:04d}.png"

    def put(self, index: int, rgba_bottom_up: bytes) -> None:
        """Queue one frame: RGBA8 rows bottom row first, as ``Framebuffer.read(components=4, alignment=1)``
        returns them. Blocks only while the queue is full; raises the writer's first error."""
        if self._closed:
            raise RuntimeError("FrameWriter.put() after close()")
        w, h = self.size
        if len(rgba_bottom_up) != w * h * 4:
            raise ValueError(f"a {w}x{h} RGBA frame is {w * h * 4} bytes, got {len(rgba_bottom_up)}")
        self._raise_error()
        self._queue.put((index, rgba_bottom_up))

    def close(self, *, abandon: bool = False) -> None:
        """Wait until every queued frame is written (or, with `abandon`, drop those not started) and
        stop the thread; raises the writer's first error. Idempotent."""
        if not self._closed:
            self._closed = True
            if abandon:
                self._abandon.set()
            self._queue.put(None)
            self._thread.join()
        self._raise_error()

    def __enter__(self) -> FrameWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:  # the run already failed: stop quickly, and keep its error rather than a writer's
            self._abandon.set()
            try:
                self.close(abandon=True)
            except EngineError as err:
                log.debug("frame writer: %s", err)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is not None or self._abandon.is_set():
                continue  # keep draining, so a put() waiting for room never blocks forever
            index, data = item
            try:
                self._write(self.path(index), data)
                self.written += 1
            except EngineError as exc:
                self._error = exc
            except OSError as exc:
                self._error = EngineError(f"cannot write {self.path(index)}: {exc.strerror or exc}")

    def _write(self, path: Path, data: bytes) -> None:
        from PIL import Image

        # orientation -1: the rows are bottom-up; Pillow flips while reading, without a copy in numpy
        img = Image.frombuffer("RGBA", self.size, data, "raw", "RGBA", 0, -1).convert("RGB")
        fd, tmp = create_temp(path)
        try:
            with os.fdopen(fd, "wb") as f:
                img.save(f, format="PNG", compress_level=self.compress_level)
                os.fchmod(f.fileno(), output_mode())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def run_headless(cfg: DemoConfig) -> dict:
    from ..gl.context import headless_context

    out = cfg.out or cache_dir() / "demo-frames"
    out.mkdir(parents=True, exist_ok=True)
    telemetry = cfg.telemetry or out / "telemetry.jsonl"
    cfg = DemoConfig(**{**cfg.__dict__, "telemetry": telemetry, "headless": True})
    ctx = headless_context()
    try:
        demo = Demo(ctx, cfg, progress=sys.stderr.isatty())
        color = depth = fbo = None
        try:
            color, depth = ctx.renderbuffer(cfg.size, 4), ctx.depth_renderbuffer(cfg.size)
            fbo = ctx.framebuffer(color_attachments=[color], depth_attachment=depth)
            records, loop_seconds = [], 0.0
            assert demo.frame_dt is not None
            with FrameWriter(out, cfg.size) as frames:
                for i in range(cfg.frames):
                    t0 = time.perf_counter()
                    records.append(demo.frame(demo.path.pose(i * demo.frame_dt), fbo, cfg.size))
                    pixels = fbo.read(components=4, alignment=1)  # waits for the frame
                    loop_seconds += time.perf_counter() - t0
                    frames.put(i, pixels)  # encoded on the writer thread while the next frame renders
            summary = demo.telemetry.write_summary(out / "summary.json")
            report = run_report(demo, records, loop_seconds)
            (out / "run.json").write_text(json.dumps(asdict(report), indent=2) + "\n", encoding="utf-8")
        finally:
            for obj in (fbo, color, depth):
                if obj is not None:
                    obj.release()
            mem = demo.close()
    finally:
        ctx.release()
    print(mem)
    print("\n".join(report.lines()))
    print(f"telemetry.jsonl, summary.json and run.json beside the {cfg.frames} frames (frame_0000.png ...)")
    print(f"frames: {out.resolve()}")  # last, so the folder is the line a reader sees
    return summary


@dataclass
class FlyCamera:
    x: float
    y: float
    z: float
    yaw: float = 0.0  # radians, 0 looks along +x
    pitch: float = -0.25  # radians, negative looks down at the ground

    def forward(self) -> np.ndarray:
        cp = math.cos(self.pitch)
        return np.array([cp * math.cos(self.yaw), cp * math.sin(self.yaw), -math.sin(self.pitch)])

    def pose(self) -> Pose:
        eye = np.array([self.x, self.y, self.z])
        return Pose(eye, eye + self.forward())

    @classmethod
    def from_pose(cls, pose: Pose) -> FlyCamera:
        d = pose.target - pose.eye
        d = d / np.linalg.norm(d)
        return cls(*pose.eye.tolist(), yaw=math.atan2(d[1], d[0]), pitch=-math.asin(max(-1.0, min(1.0, d[2]))))


HINT_BACKGROUND = (12, 14, 18, 200)


def run_window(cfg: DemoConfig) -> None:  # pragma: no cover - exercised under Xvfb by the tests
    import glfw

    errors: list[str] = []  # GLFW's own words, for the one-line error (instead of its warnings)

    def on_error(code: int, description: bytes) -> None:
        errors.append(description.decode(errors="replace") if isinstance(description, bytes) else str(description))
        log.debug("GLFW error %s: %s", code, errors[-1])

    def why() -> str:
        return f" ({errors[-1]})" if errors else ""

    glfw.set_error_callback(on_error)
    if not glfw.init():
        raise EngineError(f"no display: GLFW could not initialise{why()}; use --headless")
    try:
        glfw.window_hint(glfw.CONTEXT_VERSION_MAJOR, 4)
        glfw.window_hint(glfw.CONTEXT_VERSION_MINOR, 5)
        glfw.window_hint(glfw.OPENGL_PROFILE, glfw.OPENGL_CORE_PROFILE)
        window = glfw.create_window(cfg.size[0], cfg.size[1], "texstream demo", None, None)
        if not window:
            raise EngineError(f"could not open an OpenGL 4.5 window{why()}; use --headless")
        glfw.make_context_current(window)
        glfw.swap_interval(1)
        ctx = moderngl.create_context()
        demo = Demo(ctx, cfg)
        try:
            _window_loop(glfw, window, ctx, demo, cfg)
        finally:
            print(demo.close())
        glfw.destroy_window(window)
    finally:
        glfw.terminate()


# Movement keys: (GLFW key name, direction in the camera's frame: forward, right, up)
MOVE_KEYS = (
    ("KEY_W", (1, 0, 0)),
    ("KEY_S", (-1, 0, 0)),
    ("KEY_D", (0, 1, 0)),
    ("KEY_A", (0, -1, 0)),
    ("KEY_Q", (0, 0, 1)),
    ("KEY_E", (0, 0, -1)),
)
HINT_SECONDS = 8.0  # the controls stay on screen this long after the user takes the camera


class FlightControl:
    """Who moves the camera: the scripted flight, or the user.

    The flight plays first. Space, a movement key or the right mouse button (look) during it hands
    the camera over where it is; Space replays the flight from its start. When the flight ends the
    camera is the user's. `hint()` is the line the window shows about it.
    """

    def __init__(self, path: CameraPath, now: float) -> None:
        self.path = path
        self.cam = FlyCamera.from_pose(path.pose(0.0))
        self._started: float | None = now
        self._handed_over: float | None = None

    @property
    def playing(self) -> bool:
        return self._started is not None

    def toggle(self, now: float) -> None:
        """Space: hand over the camera while the flight plays, else replay it from the start."""
        if self.playing:
            self.take_over(now)
        else:
            self._started = now

    def take_over(self, now: float) -> None:
        self._started = None
        self._handed_over = now

    def pose(
        self, now: float, dt: float, move: np.ndarray, look: tuple[float, float] | None, fast: bool = False
    ) -> Pose:
        """The camera of this frame. `move`: (forward, right, up) from the keys held; `look`: the mouse
        movement in pixels while the right button is held (None when it is not)."""
        if self.playing and (np.any(move) or look is not None):
            self.take_over(now)
        if self._started is not None:
            t = now - self._started
            pose = self.path.pose(t)
            self.cam = FlyCamera.from_pose(pose)
            if t > self.path.duration:
                self.take_over(now)
            return pose
        cam = self.cam
        if look is not None:
            cam.yaw += look[0] * 0.003
            cam.pitch = max(-1.5, min(1.5, cam.pitch - look[1] * 0.003))
        speed = (600.0 if fast else 120.0) * dt
        right = np.array([-math.sin(cam.yaw), math.cos(cam.yaw), 0.0])
        step = move[0] * cam.forward() + move[1] * right + move[2] * np.array([0.0, 0.0, -1.0])
        cam.x, cam.y, cam.z = (np.array([cam.x, cam.y, cam.z]) + step * speed).tolist()
        cam.z = min(cam.z, -2.0)  # above the ground
        return cam.pose()

    def hint(self, now: float) -> str | None:
        if self._started is not None:
            t = min(now - self._started, self.path.duration)
            # Exactly what pose() treats as taking over; everything else (H, M, R, F, +/-, P) works meanwhile.
            return (
                f"scripted flight {t:.0f} / {self.path.duration:.0f} s: "
                "mouse moves are ignored unless the right button is held\n"
                "Space, W A S D Q E or right-drag: take the camera from here"
            )
        if self._handed_over is not None and now - self._handed_over < HINT_SECONDS:
            return (
                "your camera: WASD move, Q/E up/down, Shift faster, right mouse button: look\n"
                "Space: replay the flight, H: hide the overlay"
            )
        return None


def _window_loop(glfw, window, ctx: moderngl.Context, demo: Demo, cfg: DemoConfig) -> None:  # noqa: ANN001
    control = FlightControl(demo.path, time.perf_counter())
    last = time.perf_counter()
    mouse: tuple[float, float] | None = None
    frames_left = int(os.environ.get("TEXSTREAM_DEMO_FRAMES", "0")) or None  # tests: run N frames and quit
    screenshot = False
    move_keys = [(getattr(glfw, name), np.array(vec, float)) for name, vec in MOVE_KEYS]

    def on_key(win, key, scancode, action, mods) -> None:  # noqa: ANN001
        nonlocal screenshot
        if action != glfw.PRESS:
            return
        if key == glfw.KEY_ESCAPE:
            glfw.set_window_should_close(win, True)
        elif key == glfw.KEY_H:
            demo.show_overlay = not demo.show_overlay
        elif key == glfw.KEY_M:
            demo.scene.debug = 0 if demo.scene.debug == 1 else 1
        elif key == glfw.KEY_R:
            demo.scene.debug = 0 if demo.scene.debug == 2 else 2
        elif key == glfw.KEY_F:
            demo.streamer.freeze_feedback = not demo.streamer.freeze_feedback
        elif key in (glfw.KEY_EQUAL, glfw.KEY_KP_ADD):
            demo.streamer.set_budget(demo.streamer.budget.budget / 2**20 * 1.25)
        elif key in (glfw.KEY_MINUS, glfw.KEY_KP_SUBTRACT):
            try:
                demo.streamer.set_budget(demo.streamer.budget.budget / 2**20 / 1.25)
            except EngineError as exc:
                log.warning("%s", exc)
        elif key == glfw.KEY_P:  # taken after the next draw: the back buffer is undefined after a swap
            screenshot = True
        elif key == glfw.KEY_SPACE:
            control.toggle(time.perf_counter())

    glfw.set_key_callback(window, on_key)
    while not glfw.window_should_close(window):
        now = time.perf_counter()
        dt, last = now - last, now
        glfw.poll_events()
        look = None
        if glfw.get_mouse_button(window, glfw.MOUSE_BUTTON_RIGHT) == glfw.PRESS:
            mx, my = glfw.get_cursor_pos(window)
            look = (mx - mouse[0], my - mouse[1]) if mouse is not None else (0.0, 0.0)
            mouse = (mx, my)
        else:
            mouse = None
        move = sum((vec for key, vec in move_keys if glfw.get_key(window, key) == glfw.PRESS), np.zeros(3))
        fast = glfw.get_key(window, glfw.KEY_LEFT_SHIFT) == glfw.PRESS
        pose = control.pose(now, dt, move, look, fast)
        size = glfw.get_framebuffer_size(window)
        if size[0] < 1 or size[1] < 1:  # minimised: nothing to draw into
            glfw.wait_events_timeout(0.1)
            continue
        demo.frame(pose, ctx.screen, size)
        hint = control.hint(now)
        if hint and demo.show_overlay and demo.overlay is not None:  # bottom right: the HUD is top left
            font = demo.overlay.font
            lines = hint.split("\n")
            x = size[0] - 12 - math.ceil(max(font.measure(line) for line in lines))
            y = size[1] - 12 - len(lines) * font.line_height
            demo.overlay.draw_text(hint, size, (max(0, x), max(0, y)), background=HINT_BACKGROUND)
        if screenshot:
            screenshot = False
            w, h = size
            data = ctx.screen.read(viewport=(0, 0, w, h), components=4, alignment=1)
            shot = Path(f"texstream-{time.strftime('%Y%m%d-%H%M%S')}.png")
            write_image(np.frombuffer(data, np.uint8).reshape(h, w, 4)[::-1], shot, "RGB")
            print(f"screenshot {shot}")
        glfw.swap_buffers(window)
        if frames_left is not None:
            frames_left -= 1
            if frames_left <= 0:
                break


def run(cfg: DemoConfig) -> None:
    if cfg.headless or not has_display():
        if not cfg.headless:
            print(
                "no display found: running headless (EGL), writing frames instead of opening a window", file=sys.stderr
            )
        run_headless(cfg)
    else:
        run_window(cfg)
