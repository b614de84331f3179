"""The gallery: a field of square canvases lying on the ground, each with its own virtual texture,
all streaming through one budget; and the camera flight over it.

World units: the ground is z = 0 and the camera flies at z < 0 (as over the terrain, see
camera.py); canvases are `GalleryLayout.object_size` units a side, `pitch` apart, in a grid of
`columns` x `rows` (longer along x, the way the flight goes).

Drawing: every texture of a cache pool samples the same cache texture, so the objects of a pool
draw in ONE instanced call; the per-object texture description (`VTInfo` size, tile and meta) and
placement are instance attributes, written once when the scene is made. Per frame the scene sets
a handful of uniforms per pool; nothing is done per object in Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import moderngl
import numpy as np

from ..gl.shaders import program as load_program
from ..gl.shaders import shader_file
from ..runtime.streamer import VirtualTexture
from .paths import CameraPath, Keyframe, Pose
from .terrain import SKY

__all__ = ["GalleryLayout", "GalleryScene", "gallery_flight"]

INSTANCE = np.dtype([("rect", np.float32, 4), ("size", np.float32, 4), ("tile", np.float32, 4), ("meta", np.int32, 4)])
INSTANCE_FORMAT = "4f 4f 4f 4i /i"
INSTANCE_ATTRIBUTES = ("in_rect", "in_size", "in_tile", "in_meta")


@dataclass(frozen=True)
class GalleryLayout:
    """Where `count` canvases lie: a grid about twice as long (x) as it is wide (y)."""

    count: int
    object_size: float = 256.0
    gap: float = 64.0

    def __post_init__(self) -> None:
        if not (isinstance(self.count, int) and self.count >= 1):
            raise ValueError(f"a gallery needs at least one object, got {self.count!r}")

    @property
    def columns(self) -> int:
        return math.ceil(math.sqrt(2 * self.count))

    @property
    def rows(self) -> int:
        return math.ceil(self.count / self.columns)

    @property
    def pitch(self) -> float:
        return self.object_size + self.gap

    @property
    def extent(self) -> tuple[float, float]:
        """World width and height of the field, gaps included."""
        return self.columns * self.pitch, self.rows * self.pitch

    def rects(self) -> np.ndarray:
        """(count, 4) float32: x, y, width, height of each canvas, row by row."""
        i = np.arange(self.count)
        x = (i % self.columns) * self.pitch + self.gap / 2
        y = (i // self.columns) * self.pitch + self.gap / 2
        side = np.full(self.count, self.object_size)
        return np.stack([x, y, side, side], axis=1).astype(np.float32)


def gallery_flight(layout: GalleryLayout, seconds: float = 30.0) -> CameraPath:
    """Low along the field and back: near canvases at their finest levels, far ones coarse, and most of
    the field in view at some moment (every texture is wanted during the flight)."""
    w, h = layout.extent
    low, high = layout.object_size * 0.2, layout.object_size * 1.2
    # (u, v, altitude) of the eye; each key looks at the next key's ground point
    route = [
        (-0.05, 0.15, high),
        (0.25, 0.3, low),
        (0.5, 0.2, low),
        (0.75, 0.45, low),
        (1.0, 0.75, high),
        (0.7, 0.85, low),
        (0.4, 0.7, low),
        (0.15, 0.9, low),
        (-0.05, 0.5, high * 1.5),
    ]
    keys = []
    for i, (u, v, alt) in enumerate(route):
        nu, nv, _ = route[min(i + 1, len(route) - 1)] if i + 1 < len(route) else (0.5, 0.5, 0.0)
        keys.append(Keyframe(seconds * i / (len(route) - 1), (u * w, v * h, -alt), (nu * w, nv * h, 0.0)))
    return CameraPath("gallery", keys)


def instance_records(textures: Sequence[VirtualTexture], rects: np.ndarray) -> np.ndarray:
    """One INSTANCE record per texture: its canvas and the per-texture part of its `VTInfo`."""
    out = np.zeros(len(textures), INSTANCE)
    out["rect"] = rects[: len(textures)]
    for i, vt in enumerate(textures):  # once, when the scene is made
        h = vt.header
        out["size"][i] = (h.width, h.height, 1.0 / h.width, 1.0 / h.height)
        out["tile"][i] = (h.tile_size, h.border, h.slot_size, 0.0)
        out["meta"][i] = vt.shader_meta  # level count, page-table base, wrap/origin flags, anisotropy
    return out


class GalleryScene:
    """Draws one canvas per virtual texture (in `GalleryLayout` order) over a plain ground."""

    def __init__(self, ctx: moderngl.Context, textures: Sequence[VirtualTexture], layout: GalleryLayout) -> None:
        if len(textures) > layout.count:
            raise ValueError(f"{len(textures)} textures for a layout of {layout.count} objects")
        self.ctx, self.layout = ctx, layout
        self.textures = list(textures)
        self.debug = 0  # 0 shaded, 1 mip level, 2 residency
        self.fog_distance = max(layout.extent) * 0.45  # world units at which fog reaches 63 %
        self._released = False
        self._objects: list[moderngl.Buffer | moderngl.VertexArray] = []
        self.program = load_program(
            ctx, vertex=shader_file("texstream/gallery_vs.glsl"), fragment=shader_file("texstream/gallery_fs.glsl")
        )
        try:
            self.quad = ctx.buffer(np.array([0, 0, 1, 0, 0, 1, 1, 1], np.float32).tobytes())
            records = instance_records(self.textures, layout.rects())
            # one instanced draw per cache pool: (a texture of the pool, its VAO, its instance count)
            self.batches: list[tuple[VirtualTexture, moderngl.VertexArray, int]] = []
            pools = np.array([vt.pool.index for vt in self.textures])
            for p in np.unique(pools).tolist():
                members = np.flatnonzero(pools == p)
                self.batches.append((self.textures[members[0]], self._vao(records[members]), int(members.size)))
            margin = layout.pitch * 40  # the ground reaches the horizon's fog
            w, h = layout.extent
            ground = np.zeros(1, INSTANCE)
            ground["rect"] = (-margin, -margin, w + 2 * margin, h + 2 * margin)
            self.ground = self._vao(ground)
        except BaseException:
            self.release()
            raise

    def _vao(self, records: np.ndarray) -> moderngl.VertexArray:
        buf = self.ctx.buffer(records.tobytes())
        self._objects.append(buf)
        vao = self.ctx.vertex_array(
            self.program, [(self.quad, "2f", "in_pos"), (buf, INSTANCE_FORMAT, *INSTANCE_ATTRIBUTES)]
        )
        self._objects.append(vao)
        return vao

    @property
    def size(self) -> tuple[float, float]:
        return self.layout.extent

    def draw(self, pose: Pose, fb_size: tuple[int, int]) -> None:
        p = self.program
        w, h = self.layout.extent
        vp = pose.view_projection(fb_size[0] / max(1, fb_size[1]), far=math.hypot(w, h) * 3.0)
        p["u_view_proj"].write(vp.T.astype(np.float32).tobytes())
        p["u_eye"].value = tuple(float(v) for v in pose.eye)
        p["u_sky"].value = SKY
        p["u_fog_distance"].value = float(self.fog_distance)
        p["u_debug"].value = self.debug
        if not self.batches:
            return
        # the pool uniforms must be valid for the ground draw too (it samples nothing)
        self.batches[0][0].bind(p, "u_pool")
        p["u_ground"].value = True
        self.ground.render(moderngl.TRIANGLE_STRIP)
        p["u_ground"].value = False
        for first, vao, count in self.batches:
            first.bind(p, "u_pool")  # the pool's cache and layout; the rest is per instance
            vao.render(moderngl.TRIANGLE_STRIP, instances=count)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        for obj in reversed(self._objects):
            obj.release()
        self._objects.clear()
        for name in ("quad", "program"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.release()
