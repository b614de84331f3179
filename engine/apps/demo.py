"""`texstream demo`: a terrain flythrough streaming huge textures inside a small VRAM budget.

With a display, a GLFW window: mouse look (hold the right button) and WASD (Q/E down/up, Shift
faster), Space replays the scripted flythrough, H toggles the overlay, M colours by resident mip
level, R colours by residency (green: wanted level resident, yellow: one level coarser, red: more),
F freezes feedback, + / - raise or lower the budget by 25 %, P writes a screenshot, Esc quits.

Without a display (or with --headless) it renders the scripted flythrough through EGL and writes PNG
frames, the per-frame telemetry (JSONL) and the run summary (JSON) into --out.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import moderngl
import numpy as np

from ..config import BudgetConfig, StreamerConfig, cache_dir
from ..errors import EngineError
from ..pack.extract import write_image
from ..pack.format import TexelFormat
from ..runtime.streamer import Streamer, VirtualTexture
from ..scene.paths import DEMO_WAYPOINTS, FLYTHROUGH_WAYPOINTS, CameraPath, Pose, flythrough
from ..scene.terrain import TerrainScene, sky_clear_colour
from ..telemetry import Overlay, Telemetry, memory_summary
from .assets import DEFAULT_NORMALS, DEFAULT_TERRAIN, ensure_asset

log = logging.getLogger(__name__)

FPS = 60.0
MAX_SIZE = 16384  # a side: GL_MAX_RENDERBUFFER_SIZE / GL_MAX_VIEWPORT_DIMS on common drivers


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    packs: tuple[str, ...] = ()  # empty: the built-in terrain colour + normal map
    size: tuple[int, int] = (1280, 720)
    budget_mb: float = 192.0  # far below the 512 MiB + 256 MiB the two default textures would need
    headless: bool = False
    frames: int = 60  # headless frame count
    out: Path | None = None  # headless output folder
    telemetry: Path | None = None
    overlay: bool = True

    def __post_init__(self) -> None:  # ValueError: the CLI prints it as one line (exit 2)
        w, h = self.size
        if not (isinstance(w, int) and isinstance(h, int) and 1 <= w <= MAX_SIZE and 1 <= h <= MAX_SIZE):
            raise ValueError(f"frame size {w}x{h} must be within 1..{MAX_SIZE} a side")
        if not (math.isfinite(self.budget_mb) and self.budget_mb > 0):
            raise ValueError(f"budget must be a positive number of MiB, got {self.budget_mb!r}")
        if self.frames < 1:
            raise ValueError(f"frames must be >= 1, got {self.frames!r}")


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
        self.streamer = Streamer(ctx, StreamerConfig(budget=BudgetConfig(budget_mb=cfg.budget_mb)))
        try:
            self.albedo, self.normals = open_textures(self.streamer, cfg.packs, progress)
            self.scene = TerrainScene(ctx, self.albedo, self.normals)
            self.telemetry = Telemetry(self.streamer, dt=None if not cfg.headless else 1.0 / FPS)
            if cfg.telemetry and Path(cfg.telemetry).suffix.lower() == ".csv":
                self.telemetry.write_csv(cfg.telemetry)
            elif cfg.telemetry:
                self.telemetry.write_jsonl(cfg.telemetry)
            self.overlay = Overlay(ctx) if cfg.overlay else None
        except BaseException:
            self.streamer.release()
            raise
        w, h = self.scene.size
        # The built-in terrain gets a path over its land; other packs the generic one.
        waypoints = DEMO_WAYPOINTS if not cfg.packs else FLYTHROUGH_WAYPOINTS
        self.path: CameraPath = flythrough(w, h, altitude=90.0, seconds=30.0, waypoints=waypoints)
        self.show_overlay = cfg.overlay

    def frame(self, pose: Pose, fbo: moderngl.Framebuffer, fb_size: tuple[int, int]) -> None:
        self.telemetry.update()
        fbo.viewport = (0, 0, fb_size[0], fb_size[1])  # the window's may have been resized since
        fbo.use()
        fbo.clear(*sky_clear_colour(), 1.0)
        self.telemetry.gpu_begin()
        self.scene.draw(pose, fb_size)
        self.telemetry.gpu_end()
        if self.overlay is not None and self.show_overlay:
            self.overlay.draw(self.telemetry, fb_size)

    def close(self) -> str:
        """Release everything; returns the memory summary taken just before."""
        summary = memory_summary(self.streamer)
        if self.overlay is not None:
            self.overlay.release()
        self.telemetry.release()
        self.scene.release()
        self.streamer.release()
        return summary


def run_headless(cfg: DemoConfig) -> dict:
    from ..gl.context import headless_context

    out = cfg.out or cache_dir() / "demo-frames"
    out.mkdir(parents=True, exist_ok=True)
    telemetry = cfg.telemetry or out / "telemetry.jsonl"
    cfg = DemoConfig(**{**cfg.__dict__, "telemetry": telemetry})
    ctx = headless_context()
    try:
        demo = Demo(ctx, cfg, progress=sys.stderr.isatty())
        color = fbo = None
        try:
            color = ctx.renderbuffer(cfg.size, 4)
            fbo = ctx.framebuffer(color_attachments=[color])
            for i in range(cfg.frames):
                demo.frame(demo.path.pose(i / FPS), fbo, cfg.size)
                img = np.frombuffer(fbo.read(components=4, alignment=1), np.uint8)
                write_image(img.reshape(cfg.size[1], cfg.size[0], 4)[::-1], out / f"frame_{i:04d}.png", "RGB")
            summary = demo.telemetry.write_summary(out / "summary.json")
        finally:
            for obj in (fbo, color):
                if obj is not None:
                    obj.release()
            mem = demo.close()
    finally:
        ctx.release()
    print(mem)
    print(f"wrote {cfg.frames} frames, telemetry and summary to {out}")
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


def _window_loop(glfw, window, ctx: moderngl.Context, demo: Demo, cfg: DemoConfig) -> None:  # noqa: ANN001
    cam = FlyCamera.from_pose(demo.path.pose(0.0))
    replay_from: float | None = time.perf_counter()
    last = time.perf_counter()
    mouse: tuple[float, float] | None = None
    frames_left = int(os.environ.get("TEXSTREAM_DEMO_FRAMES", "0")) or None  # tests: run N frames and quit
    screenshot = False

    def on_key(win, key, scancode, action, mods) -> None:  # noqa: ANN001
        nonlocal replay_from, screenshot
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
            replay_from = time.perf_counter() if replay_from is None else None

    glfw.set_key_callback(window, on_key)
    while not glfw.window_should_close(window):
        now = time.perf_counter()
        dt, last = now - last, now
        glfw.poll_events()
        if replay_from is not None:
            t = now - replay_from
            pose = demo.path.pose(t)
            cam = FlyCamera.from_pose(pose)
            if t > demo.path.duration:
                replay_from = None
        else:
            if glfw.get_mouse_button(window, glfw.MOUSE_BUTTON_RIGHT) == glfw.PRESS:
                mx, my = glfw.get_cursor_pos(window)
                if mouse is not None:
                    cam.yaw += (mx - mouse[0]) * 0.003
                    cam.pitch = max(-1.5, min(1.5, cam.pitch - (my - mouse[1]) * 0.003))
                mouse = (mx, my)
            else:
                mouse = None
            speed = (600.0 if glfw.get_key(window, glfw.KEY_LEFT_SHIFT) == glfw.PRESS else 120.0) * dt
            fwd = cam.forward()
            right = np.array([-math.sin(cam.yaw), math.cos(cam.yaw), 0.0])
            move = np.zeros(3)
            for key, vec in ((glfw.KEY_W, fwd), (glfw.KEY_S, -fwd), (glfw.KEY_D, right), (glfw.KEY_A, -right),
                             (glfw.KEY_Q, np.array([0, 0, 1.0])), (glfw.KEY_E, np.array([0, 0, -1.0]))):  # fmt: skip
                if glfw.get_key(window, key) == glfw.PRESS:
                    move += vec
            cam.x, cam.y, cam.z = (np.array([cam.x, cam.y, cam.z]) + move * speed).tolist()
            cam.z = min(cam.z, -2.0)
            pose = cam.pose()
        size = glfw.get_framebuffer_size(window)
        if size[0] < 1 or size[1] < 1:  # minimised: nothing to draw into
            glfw.wait_events_timeout(0.1)
            continue
        demo.frame(pose, ctx.screen, size)
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
            print("no display found: running headless (EGL), writing frames instead of opening a window",
                  file=sys.stderr)  # fmt: skip
        run_headless(cfg)
    else:
        run_window(cfg)
