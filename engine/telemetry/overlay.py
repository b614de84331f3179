"""The telemetry HUD: a translucent panel drawn with moderngl over any frame, in one call.

::

    overlay = Overlay(ctx)                       # once, on the render thread
    ...
    overlay.draw(telemetry, (width, height))     # after the scene, into the bound framebuffer
    ...
    overlay.release()

Contents: engine VRAM used / budget as a bar with a coloured segment per cache pool (plus page
tables, staging ring and feedback), peak marker; the working set the view wants at full detail
against the cache slots it must fit in (the pools take the whole budget up front, so this bar, not
the VRAM one, shows budget pressure); mip bias and headroom; tiles resident / wanted /
missing / in flight / queued and uploads this frame; an upload MB/s graph; latency p50/p95/p99,
staging-ring occupancy and stalls, feedback age, evictions/s, re-fetches and corrupt tiles; CPU
``update()`` and GPU frame time graphs; one residency minimap per virtual texture (the level each
page of level 0 samples, colour-coded, red where nothing is resident).

Drawing: every element (panel, bars, graphs, glyphs, minimaps) is a quad in one vertex buffer,
rebuilt with numpy each frame and drawn with ONE draw call; glyphs come from a font atlas
rasterized once with Pillow (`GlyphAtlas`), minimaps from one small RGBA atlas texture. The draw
sets the viewport to `fb_size`, enables alpha blending and disables depth test and face culling,
then restores the viewport, the blend/depth/cull enables, the blend function and blend equation it
found. It leaves its two textures bound to `texture_units` (default 6 and 7: below the units the
virtual textures use) and does not touch the scissor test (a scissor clips the HUD too).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import moderngl
import numpy as np

from ..errors import GLError
from ..gl.gl_ext import GLExt
from ..gl.shaders import program as load_program
from ..gl.shaders import shader_file
from .hud_layout import LEVEL_COLOURS, NO_LEVEL_COLOUR, TEXT, HudLayout, MinimapAtlas
from .quads import BACK, Colour, QuadBatch

if TYPE_CHECKING:
    from ..runtime.streamer import VirtualTexture
    from .stats import Telemetry

__all__ = ["LEVEL_COLOURS", "NO_LEVEL_COLOUR", "Overlay"]

log = logging.getLogger(__name__)

# GL state queried so it can be restored
GL_BLEND, GL_DEPTH_TEST, GL_CULL_FACE = 0x0BE2, 0x0B71, 0x0B44
GL_BLEND_SRC_RGB, GL_BLEND_DST_RGB, GL_BLEND_SRC_ALPHA, GL_BLEND_DST_ALPHA = 0x80C9, 0x80C8, 0x80CB, 0x80CA
GL_BLEND_EQUATION_RGB, GL_BLEND_EQUATION_ALPHA = 0x8009, 0x883D
_BLEND_FUNC_PARAMS = (GL_BLEND_SRC_RGB, GL_BLEND_DST_RGB, GL_BLEND_SRC_ALPHA, GL_BLEND_DST_ALPHA)

MINIMAP_BUFFERS = 3  # minimap atlases in rotation (more than the frames a driver keeps in flight)


class Overlay:
    """Draws a `Telemetry`'s HUD over the bound framebuffer (render thread only).

    Parameters
    ----------
    ctx
        The moderngl context to draw with.
    font_size
        Text height in pixels (the font is scalable; see `load_font`).
    corner
        Where the panel sits: "top-left", "top-right", "bottom-left" or "bottom-right".
    margin
        Pixels between the panel and the framebuffer's edges.
    minimap_pages
        A minimap shows at most this many pages a side (larger textures are sampled).
    minimap_size
        Displayed size of a minimap's longer side, pixels.
    minimap_every
        The minimaps are refreshed every this many `draw` calls.
    max_minimaps
        Minimaps shown at most (the rest are counted).
    texture_units
        Units for the font atlas and the minimap atlas.
    gl
        The context's `GLExt` (for reading the GL state it restores); made on first use if None.
    """

    def __init__(
        self,
        ctx: moderngl.Context,
        *,
        font_size: float = 13,
        corner: str = "top-left",
        margin: int = 8,
        minimap_pages: int = 128,
        minimap_size: int = 96,
        minimap_every: int = 2,
        max_minimaps: int = 6,
        texture_units: tuple[int, int] = (6, 7),
        gl: GLExt | None = None,
    ) -> None:
        if minimap_every < 1:
            raise ValueError(f"minimap_every must be >= 1, got {minimap_every!r}")
        if len(texture_units) != 2 or texture_units[0] == texture_units[1] or min(texture_units) < 0:
            raise ValueError(f"texture_units must be two different units, got {texture_units!r}")
        self.layout = HudLayout(
            font_size=font_size,
            corner=corner,
            margin=margin,
            minimap_pages=minimap_pages,
            minimap_size=minimap_size,
            max_minimaps=max_minimaps,
        )
        self.ctx = ctx
        self.minimap_every = minimap_every
        self.texture_units = texture_units
        self._gl = gl
        self._gl_failed = False
        self.font = self.layout.font
        self.last_rect: tuple[int, int, int, int] | None = None  # x, y, w, h of the last panel (y down)
        self._draws = 0
        self._atlas: MinimapAtlas | None = None  # the minimaps uploaded last
        self._minimap_textures: list[moderngl.Texture | None] = [None] * MINIMAP_BUFFERS
        self._minimap_current = 0
        self._released = False

        made: list[Any] = []  # released again if a later step fails
        try:
            self.program = load_program(
                ctx, vertex=shader_file("texstream/overlay_vs.glsl"), fragment=shader_file("texstream/overlay_fs.glsl")
            )
            made.append(self.program)
            self.program["u_font"].value = texture_units[0]
            self.program["u_minimap"].value = texture_units[1]
            img = self.font.image
            self.font_texture = ctx.texture(img.size, 1, img.tobytes(), alignment=1)
            made.append(self.font_texture)
            self.font_texture.filter = (moderngl.NEAREST, moderngl.NEAREST)
            self.font_texture.repeat_x = self.font_texture.repeat_y = False
            self._capacity = 1 << 16
            self.vbo = ctx.buffer(reserve=self._capacity, dynamic=True)
            made.append(self.vbo)
            self.vao = ctx.vertex_array(
                self.program, [(self.vbo, "2f 2f 4f1 1f", "in_pos", "in_uv", "in_color", "in_mode")]
            )
        except BaseException:
            for obj in reversed(made):
                obj.release()
            raise
        log.debug("overlay font: %s", self.font.describe())

    @property
    def margin(self) -> int:
        """Pixels between the panel and the framebuffer's edges."""
        return self.layout.margin

    def residency_image(self, vt: VirtualTexture) -> np.ndarray:
        """The minimap of `vt`: the level each level-0 page samples (`HudLayout.residency_image`)."""
        return self.layout.residency_image(vt)

    # ---- public drawing ---------------------------------------------------------------------
    def draw(self, telemetry: Telemetry, fb_size: tuple[int, int]) -> tuple[int, int, int, int]:
        """Draw the HUD of `telemetry`'s latest frame into the bound framebuffer of size `fb_size`.

        Returns the panel rectangle (x, y, w, h) in pixels from the top-left; nothing outside it
        changes.
        """
        size = self._check_size(fb_size)
        self._check_open()
        layout = self.layout
        streamer = telemetry.streamer
        if telemetry.last is not None and streamer.textures:
            shown = streamer.textures[: layout.max_minimaps]
            if (
                self._draws % self.minimap_every == 0
                or self._atlas is None
                or self._atlas.texture_ids != [vt.id for vt in shown]
            ):
                self._upload_minimaps(layout.minimap_atlas(shown))
        batch = QuadBatch(self.font)
        height = layout.build(batch, telemetry, self._atlas)
        x, y = layout.place(size, layout.width, height)
        self._render(batch.vertices((x, y)), size)
        self.last_rect = (x, y, layout.width, height)
        self._draws += 1
        return self.last_rect

    def draw_text(
        self,
        text: str,
        fb_size: tuple[int, int],
        pos: tuple[int, int] = (0, 0),
        colour: Colour = TEXT,
        background: Colour | None = None,
    ) -> tuple[int, int, int, int]:
        """Draw `text` (lines split at newlines) with the overlay's font into the bound framebuffer,
        its top-left (the first line's ascender line) at pixel `pos` (y down); `background` fills
        the text's box first. Returns that box (x, y, w, h): the lines' advance boxes plus any ink
        overhanging them. Glyphs are Pillow's rendering of the font, pixel for pixel (`GlyphAtlas`)."""
        size = self._check_size(fb_size)
        self._check_open()
        lines = text.split("\n")
        lh = self.font.line_height
        x, y = int(pos[0]), int(pos[1])
        q, _ = self.font.layout_many(lines, np.full(len(lines), x, np.float64), y + lh * np.arange(len(lines)))
        # the box: every line's advance box and every glyph's ink (which may overhang it)
        x0, y0 = min([x, *q.x.tolist()]), min([y, *q.y.tolist()])
        x1 = max([x + math.ceil(max(self.font.measure(s) for s in lines)), *(q.x + q.w).tolist()])
        y1 = max([y + lh * len(lines), *(q.y + q.h).tolist()])
        batch = QuadBatch(self.font)
        if background is not None:
            batch.rect(x0, y0, x1, y1, background, BACK)
        for i, line in enumerate(lines):
            batch.text(line, x, y + i * lh, colour)
        self._render(batch.vertices(), size)
        return x0, y0, x1 - x0, y1 - y0

    # ---- minimaps (GL side) -------------------------------------------------------------------
    def _upload_minimaps(self, atlas: MinimapAtlas) -> None:
        """Upload the minimap atlas when it changed since the last upload.

        Uploads rotate through `MINIMAP_BUFFERS` textures so a write never waits for a frame in
        flight that samples the previous one.
        """
        previous, self._atlas = self._atlas, atlas
        if previous is not None and np.array_equal(previous.image, atlas.image):
            return
        aw, ah = atlas.size
        self._minimap_current = (self._minimap_current + 1) % MINIMAP_BUFFERS
        tex = self._minimap_textures[self._minimap_current]
        if tex is None or tex.size != (aw, ah):
            if tex is not None:
                tex.release()
            tex = self.ctx.texture((aw, ah), 4, atlas.image.tobytes(), alignment=1)
            tex.filter = (moderngl.NEAREST, moderngl.NEAREST)
            tex.repeat_x = tex.repeat_y = False
            self._minimap_textures[self._minimap_current] = tex
        else:
            tex.write(atlas.image.tobytes(), alignment=1)

    # ---- GL -----------------------------------------------------------------------------------
    @staticmethod
    def _check_size(fb_size: tuple[int, int]) -> tuple[int, int]:
        try:
            w, h = (int(v) for v in fb_size)
        except (TypeError, ValueError):
            raise TypeError(f"fb_size must be (width, height), got {fb_size!r}") from None
        if w < 1 or h < 1:
            raise ValueError(f"fb_size must be positive, got {fb_size!r}")
        return w, h

    def _state_gl(self) -> GLExt | None:
        if self._gl is None and not self._gl_failed:
            try:
                self._gl = GLExt(self.ctx)
            except GLError as exc:
                self._gl_failed = True
                log.warning("overlay cannot read GL state (%s); it restores GL defaults after drawing", exc)
        return self._gl

    def _check_open(self) -> None:
        if self._released:
            raise GLError("overlay used after release()")

    def _render(self, verts: np.ndarray, size: tuple[int, int]) -> None:
        if not verts.size:
            return
        data = verts.tobytes()
        while self._capacity < len(data):
            self._capacity *= 2
        self.vbo.orphan(self._capacity)  # fresh storage: never waits for the previous frame's draw
        self.vbo.write(data)
        self.program["u_fb_size"].value = (float(size[0]), float(size[1]))
        self.font_texture.use(self.texture_units[0])
        minimap = self._minimap_textures[self._minimap_current]
        (minimap or self.font_texture).use(self.texture_units[1])  # the font: never sampled, keeps it valid
        ctx = self.ctx
        gl = self._state_gl()
        saved = self._save_state(gl)
        viewport = ctx.viewport
        try:
            ctx.viewport = (0, 0, size[0], size[1])
            ctx.disable(moderngl.DEPTH_TEST | moderngl.CULL_FACE)
            ctx.enable(moderngl.BLEND)
            ctx.blend_func = (
                moderngl.SRC_ALPHA,
                moderngl.ONE_MINUS_SRC_ALPHA,
                moderngl.ONE,
                moderngl.ONE_MINUS_SRC_ALPHA,
            )
            ctx.blend_equation = moderngl.FUNC_ADD
            self.vao.render(moderngl.TRIANGLES, vertices=verts.size)
        finally:
            ctx.viewport = viewport
            self._restore_state(saved)

    @staticmethod
    def _save_state(gl: GLExt | None) -> dict[str, Any]:
        if gl is None:
            return {
                "blend": False,
                "depth": False,
                "cull": False,
                "func": (moderngl.ONE, moderngl.ZERO, moderngl.ONE, moderngl.ZERO),
                "equation": (moderngl.FUNC_ADD, moderngl.FUNC_ADD),
            }
        return {
            "blend": bool(gl.get_integer(GL_BLEND)),
            "depth": bool(gl.get_integer(GL_DEPTH_TEST)),
            "cull": bool(gl.get_integer(GL_CULL_FACE)),
            "func": tuple(gl.get_integer(p) for p in _BLEND_FUNC_PARAMS),
            "equation": (gl.get_integer(GL_BLEND_EQUATION_RGB), gl.get_integer(GL_BLEND_EQUATION_ALPHA)),
        }

    def _restore_state(self, saved: dict[str, Any]) -> None:
        ctx = self.ctx
        ctx.blend_func = saved["func"]
        ctx.blend_equation = saved["equation"]
        for flag, on in (
            (moderngl.BLEND, saved["blend"]),
            (moderngl.DEPTH_TEST, saved["depth"]),
            (moderngl.CULL_FACE, saved["cull"]),
        ):
            if on:
                ctx.enable(flag)
            else:
                ctx.disable(flag)

    def release(self) -> None:
        """Free the overlay's GL objects (idempotent; render thread)."""
        if self._released:
            return
        self._released = True
        objs: list[Any] = [self.vao, self.vbo, self.font_texture, self.program]
        objs += [t for t in self._minimap_textures if t is not None]
        self._minimap_textures = [None] * MINIMAP_BUFFERS
        for obj in objs:
            obj.release()

    def __enter__(self) -> Overlay:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()
