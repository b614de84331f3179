"""Headless rendering of a textured plane through the streamer (`texstream render`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import moderngl
import numpy as np

from ..config import BudgetConfig, StreamerConfig
from ..gl.shaders import program as load_program
from ..gl.shaders import shader_file
from ..runtime.streamer import Streamer, VirtualTexture
from ..scene.camera import View, plane_mvp
from ..telemetry import FrameRecord, Telemetry

log = logging.getLogger(__name__)


class PlaneRenderer:
    """Draws one virtual texture on the plane seen through a `View`."""

    def __init__(self, ctx: moderngl.Context, size: tuple[int, int]) -> None:
        self.ctx, self.size = ctx, size
        self.program = load_program(
            ctx, vertex=shader_file("texstream/plane_vs.glsl"), fragment=shader_file("texstream/plane_fs.glsl")
        )
        quad = np.array([0, 0, 1, 0, 0, 1, 1, 1], np.float32)
        self.vbo = ctx.buffer(quad.tobytes())
        self.vao = ctx.vertex_array(self.program, [(self.vbo, "2f", "in_pos")])
        self.color = ctx.renderbuffer(size, 4)
        self.fbo = ctx.framebuffer(color_attachments=[self.color])

    def draw(self, vt: VirtualTexture, view: View, debug: int = 0) -> None:
        h = vt.header
        mvp = plane_mvp(view, h.width, h.height, *self.size)
        self.program["u_mvp"].write(mvp.T.astype(np.float32).tobytes())
        self.program["u_size"].value = (float(h.width), float(h.height))
        self.program["u_encode_srgb"].value = bool(h.srgb)
        if "u_debug" in self.program:
            self.program["u_debug"].value = debug
        vt.bind(self.program, "u_vt")
        self.fbo.use()
        self.fbo.clear(0.0, 0.0, 0.0, 1.0)
        self.vao.render(moderngl.TRIANGLE_STRIP)

    def read(self) -> np.ndarray:
        """(h, w, 4) uint8 RGBA, top row first."""
        data = self.fbo.read(components=4, alignment=1)
        img = np.frombuffer(data, np.uint8).reshape(self.size[1], self.size[0], 4)
        return img[::-1].copy()

    def release(self) -> None:
        if self.ctx.fbo is self.fbo:
            # moderngl rebinds the context's current framebuffer after creating one; a released one
            # would make every later ctx.framebuffer() call fail (GL_INVALID_OPERATION).
            self.ctx.detect_framebuffer(0).use()
        for obj in (self.vao, self.vbo, self.fbo, self.color, self.program):
            obj.release()


@dataclass
class RenderResult:
    frames: list[np.ndarray]
    telemetry: list[FrameRecord] = field(default_factory=list)  # one record a frame (FRAME_SCHEMA's fields)


FPS = 60.0  # the frame clock of the telemetry's rates


def render(
    ctx: moderngl.Context,
    pack: str | Path,
    *,
    view: View,
    size: tuple[int, int] = (512, 512),
    frames: int = 30,
    budget_mb: float | None = None,
    all_resident: bool = False,
    keep_frames: bool = False,
    config: StreamerConfig | None = None,
    telemetry: str | Path | None = None,
) -> RenderResult:
    """Render `frames` frames of `pack` seen through `view`; returns the last (or every) frame and the
    frames' telemetry records, also written to `telemetry` (JSON lines, or CSV for a .csv name) if given."""
    cfg = config or StreamerConfig(budget=BudgetConfig(budget_mb=budget_mb))
    out = RenderResult(frames=[])
    with Streamer(ctx, cfg) as streamer, Telemetry(streamer, dt=1.0 / FPS) as recorder:
        vt = streamer.open(pack)
        if all_resident:
            streamer.make_all_resident(vt)
        if telemetry is not None and Path(telemetry).suffix.lower() == ".csv":
            recorder.write_csv(telemetry)
        elif telemetry is not None:
            recorder.write_jsonl(telemetry)
        renderer = PlaneRenderer(ctx, size)
        throttle = streamer.gl.throttle(2)  # frames in flight, as a swap chain would allow
        try:
            for i in range(frames):
                out.telemetry.append(recorder.update())
                recorder.gpu_begin()
                renderer.draw(vt, view)
                recorder.gpu_end()
                throttle.frame_done()
                if keep_frames or i == frames - 1:
                    out.frames.append(renderer.read())
        finally:
            throttle.release()
            renderer.release()
    return out
