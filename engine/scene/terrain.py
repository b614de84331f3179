"""The demo's terrain: a huge ground plane textured by virtual textures, seen from a low camera."""

from __future__ import annotations

import math

import moderngl
import numpy as np

from ..gl.shaders import program as load_program
from ..gl.shaders import shader_file
from ..runtime.streamer import VirtualTexture
from .paths import Pose

SKY = (0.52, 0.66, 0.85)  # linear


class TerrainScene:
    """Draws the ground with an albedo virtual texture, an optional normal-map one and an optional
    detail one (modulating the albedo)."""

    def __init__(
        self,
        ctx: moderngl.Context,
        albedo: VirtualTexture,
        normals: VirtualTexture | None = None,
        detail: VirtualTexture | None = None,
    ) -> None:
        self.ctx, self.albedo, self.normals, self.detail = ctx, albedo, normals, detail
        self.program = load_program(
            ctx, vertex=shader_file("texstream/terrain_vs.glsl"), fragment=shader_file("texstream/terrain_fs.glsl")
        )
        quad = np.array([0, 0, 1, 0, 0, 1, 1, 1], np.float32)
        self.vbo = ctx.buffer(quad.tobytes())
        self.vao = ctx.vertex_array(self.program, [(self.vbo, "2f", "in_pos")])
        self.debug = 0  # 0 shaded, 1 mip level, 2 residency
        self.sun = np.array([0.4, -0.3, -0.85])
        self._released = False

    @property
    def size(self) -> tuple[int, int]:
        h = self.albedo.header
        return h.width, h.height

    def draw(self, pose: Pose, fb_size: tuple[int, int]) -> None:
        p = self.program
        set_view_uniforms(p, pose, self.size, fb_size, self.sun)
        p["u_debug"].value = self.debug
        p["u_has_normals"].value = self.normals is not None
        p["u_has_detail"].value = self.detail is not None
        self.albedo.bind(p, "u_albedo")
        # unused samplers still need a valid page table and cache: reuse the albedo's
        (self.normals or self.albedo).bind(p, "u_normals")
        (self.detail or self.albedo).bind(p, "u_detail")
        self.vao.render(moderngl.TRIANGLE_STRIP)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        for obj in (self.vao, self.vbo, self.program):
            obj.release()


def set_view_uniforms(
    program: moderngl.Program, pose: Pose, size: tuple[int, int], fb_size: tuple[int, int], sun: np.ndarray
) -> None:
    """Camera, ground size, sun, sky and fog uniforms shared by terrain_vs/terrain_fs-style programs."""
    w, h = size
    vp = pose.view_projection(fb_size[0] / max(1, fb_size[1]), far=math.hypot(w, h) * 1.5)
    program["u_view_proj"].write(vp.T.astype(np.float32).tobytes())
    program["u_size"].value = (float(w), float(h))
    program["u_eye"].value = tuple(float(v) for v in pose.eye)
    program["u_sun"].value = tuple(float(v) for v in sun)
    program["u_sky"].value = SKY
    program["u_fog_distance"].value = float(max(w, h)) * 0.35


def sky_clear_colour() -> tuple[float, float, float]:
    """The fog colour as display (sRGB) values, for glClear."""

    def enc(c: float) -> float:
        return 12.92 * c if c <= 0.0031308 else 1.055 * c ** (1 / 2.4) - 0.055

    return tuple(enc(c) for c in SKY)  # type: ignore[return-value]
