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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import moderngl
import numpy as np

from ..errors import GLError
from ..gl.gl_ext import GLExt
from ..gl.shaders import program as load_program
from ..gl.shaders import shader_file
from .font import GlyphAtlas, load_font

if TYPE_CHECKING:
    from ..runtime.streamer import Streamer, VirtualTexture
    from .stats import Telemetry

__all__ = ["LEVEL_COLOURS", "Overlay"]

log = logging.getLogger(__name__)

Colour = tuple[int, int, int, int]
SOLID, GLYPH, MINIMAP = 0.0, 1.0, 2.0
VERTEX = np.dtype([("pos", np.float32, 2), ("uv", np.float32, 2), ("color", np.uint8, 4), ("mode", np.float32)])
_TRIANGLES = np.array([0, 1, 2, 0, 2, 3])
LAYERS = 5
BACK, MID, FRONT, MAP, TEXT_LAYER = range(LAYERS)  # drawn in this order

# GL state queried so it can be restored
GL_BLEND, GL_DEPTH_TEST, GL_CULL_FACE = 0x0BE2, 0x0B71, 0x0B44
GL_BLEND_SRC_RGB, GL_BLEND_DST_RGB, GL_BLEND_SRC_ALPHA, GL_BLEND_DST_ALPHA = 0x80C9, 0x80C8, 0x80CB, 0x80CA
GL_BLEND_EQUATION_RGB, GL_BLEND_EQUATION_ALPHA = 0x8009, 0x883D
_BLEND_FUNC_PARAMS = (GL_BLEND_SRC_RGB, GL_BLEND_DST_RGB, GL_BLEND_SRC_ALPHA, GL_BLEND_DST_ALPHA)

PANEL: Colour = (12, 14, 18, 200)
FRAME_EDGE: Colour = (255, 255, 255, 40)
TEXT: Colour = (235, 238, 242, 255)
DIM: Colour = (150, 158, 170, 255)
ACCENT: Colour = (110, 200, 255, 255)
WARN: Colour = (255, 190, 60, 255)
BAD: Colour = (255, 80, 70, 255)
GRAPH_BG: Colour = (255, 255, 255, 18)
CPU_COLOUR: Colour = (90, 170, 255, 220)
GPU_COLOUR: Colour = (255, 140, 60, 255)
UPLOAD_COLOUR: Colour = (90, 220, 140, 220)
WORKING_SET_COLOUR: Colour = (110, 200, 255, 230)
POOL_COLOURS: tuple[Colour, ...] = (
    (64, 190, 170, 255),
    (90, 150, 250, 255),
    (240, 120, 180, 255),
    (170, 220, 80, 255),
    (250, 160, 80, 255),
    (180, 130, 250, 255),
)
PAGE_TABLE_COLOUR: Colour = (150, 160, 180, 255)
RING_COLOUR: Colour = (200, 110, 230, 255)
FEEDBACK_COLOUR: Colour = (240, 220, 90, 255)
OTHER_COLOUR: Colour = (120, 120, 120, 255)
# Minimap: the level a page samples, finest (0) bright to coarse dark; red where nothing is resident.
LEVEL_COLOURS = np.array(
    [
        (253, 231, 37),
        (144, 215, 67),
        (53, 183, 121),
        (33, 145, 140),
        (49, 104, 142),
        (68, 57, 131),
        (72, 24, 106),
        (50, 15, 70),
    ],
    np.uint8,
)
NO_LEVEL_COLOUR = np.array((230, 40, 40), np.uint8)
GROUP_COLOURS: dict[str, Colour] = {
    "page tables": PAGE_TABLE_COLOUR,
    "ring": RING_COLOUR,
    "feedback": FEEDBACK_COLOUR,
    "other": OTHER_COLOUR,
}
FRAME_MS_REFERENCE = 1000.0 / 60.0  # reference line in the timing graph
MINIMAP_BUFFERS = 3  # minimap atlases in rotation (more than the frames a driver keeps in flight)


class _Batch:
    """Quads collected in layers (drawn back to front), turned into one triangle list by `vertices`.

    Single rectangles and text spans are kept as Python tuples and converted in one vectorized pass
    at the end, so a frame costs a fixed handful of numpy calls however many elements it has.
    """

    def __init__(self, font: GlyphAtlas) -> None:
        self.font = font
        self._rects: list[list[tuple[float, ...]]] = [[] for _ in range(LAYERS)]
        self._chunks: list[list[np.ndarray]] = [[] for _ in range(LAYERS)]  # VERTEX arrays
        self._texts: list[tuple[str, float, float, Colour]] = []

    def rect(
        self,
        x0: float,
        y0: float,
        x1: float,
        y1: float,
        colour: Colour,
        layer: int = MID,
        mode: float = SOLID,
        uv: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
    ) -> None:
        self._rects[layer].append((x0, y0, x1, y1, *uv, *colour, mode))

    def rect_array(
        self, x0: np.ndarray, y0: np.ndarray, x1: np.ndarray, y1: np.ndarray, colour: Colour, layer: int = MID
    ) -> None:
        if x0.size:
            self._chunks[layer].append(_vertices(_corners(x0, y0, x1, y1), None, np.asarray(colour, np.uint8), SOLID))

    def text(self, s: str, x: float, y: float, colour: Colour = (255, 255, 255, 255)) -> float:
        """Queue one line of text with its ascender line at y; returns the pen position after it."""
        if s:
            self._texts.append((s, x, y, colour))
        return x + self.font.measure(s)

    def segments(self, x: np.ndarray, y: np.ndarray, width: float, colour: Colour, layer: int = FRONT) -> None:
        """A polyline through (x, y) as one quad per segment; NaN points break the line."""
        if x.size < 2:
            return
        p0 = np.stack([x[:-1], y[:-1]], -1)
        p1 = np.stack([x[1:], y[1:]], -1)
        ok = np.isfinite(p0).all(-1) & np.isfinite(p1).all(-1)
        p0, p1 = p0[ok], p1[ok]
        if not p0.size:
            return
        d = p1 - p0
        length = np.maximum(np.hypot(d[:, 0], d[:, 1]), 1e-6)[:, None]
        nrm = np.stack([-d[:, 1], d[:, 0]], -1) / length * (width / 2)
        a, b = p0 - d / length * (width / 4), p1 + d / length * (width / 4)  # overlap the joints a little
        corners = np.stack([a + nrm, b + nrm, b - nrm, a - nrm], 1).astype(np.float32)
        self._chunks[layer].append(_vertices(corners, None, np.asarray(colour, np.uint8), SOLID))

    def vertices(self, offset: tuple[int, int] = (0, 0)) -> np.ndarray:
        """Every quad as triangles, back layer first, each moved by `offset` pixels."""
        parts: list[np.ndarray] = []
        for layer in range(LAYERS):
            rows = self._rects[layer]
            if rows:
                a = np.array(rows, np.float32)
                corners = _corners(a[:, 0], a[:, 1], a[:, 2], a[:, 3])
                uv = _corners(a[:, 4], a[:, 5], a[:, 6], a[:, 7])
                parts.append(_vertices(corners, uv, a[:, 8:12].astype(np.uint8), a[:, 12]))
            parts.extend(self._chunks[layer])
            if layer == TEXT_LAYER and self._texts:
                parts.append(self._glyph_vertices())
        if not parts:
            return np.zeros(0, VERTEX)
        out = np.concatenate(parts)
        if offset != (0, 0):
            out["pos"] += np.asarray(offset, np.float32)
        return out

    def _glyph_vertices(self) -> np.ndarray:
        texts = self._texts
        q, span = self.font.layout_many(
            [t[0] for t in texts],
            np.array([t[1] for t in texts], np.float64),
            np.array([t[2] for t in texts], np.float64),
        )
        colours = np.array([t[3] for t in texts], np.uint8)[span]
        corners = _corners(q.x, q.y, q.x + q.w, q.y + q.h)
        uv = _corners(q.u, q.v, q.u + q.w, q.v + q.h)
        return _vertices(corners, uv, colours, GLYPH)


def _corners(x0: np.ndarray, y0: np.ndarray, x1: np.ndarray, y1: np.ndarray) -> np.ndarray:
    """(n, 4, 2) float32 corners of axis-aligned rectangles, clockwise from the top-left."""
    out = np.empty((np.shape(x0)[0], 4, 2), np.float32)
    out[:, 0, 0] = out[:, 3, 0] = x0
    out[:, 1, 0] = out[:, 2, 0] = x1
    out[:, 0, 1] = out[:, 1, 1] = y0
    out[:, 2, 1] = out[:, 3, 1] = y1
    return out


def _vertices(corners: np.ndarray, uv: np.ndarray | None, colour: np.ndarray, mode: float | np.ndarray) -> np.ndarray:
    """Two triangles per quad: (n, 4, 2) corners -> 6n VERTEX records."""
    n = corners.shape[0]
    v = np.zeros((n, 6), VERTEX)
    v["pos"] = corners[:, _TRIANGLES]
    if uv is not None:
        v["uv"] = uv[:, _TRIANGLES]
    v["color"] = colour.reshape(-1, 1, 4) if colour.ndim == 2 else colour
    v["mode"] = np.asarray(mode, np.float32).reshape(-1, 1) if np.ndim(mode) else mode
    return v.ravel()


def _mib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 10 * 2**30 else f"{n / 2**20:.1f} MiB"


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
        if corner not in ("top-left", "top-right", "bottom-left", "bottom-right"):
            raise ValueError(f"corner must be top-left, top-right, bottom-left or bottom-right, got {corner!r}")
        if margin < 0 or minimap_pages < 1 or minimap_size < 8 or minimap_every < 1 or max_minimaps < 0:
            raise ValueError(
                f"bad overlay layout: margin {margin!r}, minimap_pages {minimap_pages!r}, "
                f"minimap_size {minimap_size!r}, minimap_every {minimap_every!r}, max_minimaps {max_minimaps!r}"
            )
        if len(texture_units) != 2 or texture_units[0] == texture_units[1] or min(texture_units) < 0:
            raise ValueError(f"texture_units must be two different units, got {texture_units!r}")
        self.ctx = ctx
        self.corner, self.margin = corner, margin
        self.minimap_pages, self.minimap_size = minimap_pages, minimap_size
        self.minimap_every, self.max_minimaps = minimap_every, max_minimaps
        self.texture_units = texture_units
        self._gl = gl
        self._gl_failed = False
        font, name = load_font(font_size)
        self.font = GlyphAtlas(font, name)
        self.pad = max(4, round(font_size * 0.6))
        self.char = float(self.font.advance[ord("0")]) or font_size * 0.6
        self.width = int(round(44 * self.char)) + 2 * self.pad
        self.last_rect: tuple[int, int, int, int] | None = None  # x, y, w, h of the last panel (y down)
        self._draws = 0
        self._minimap_slots: list[tuple[int, int, int, int, int]] = []  # tex id, x, y, w, h in the atlas
        self._minimap_textures: list[moderngl.Texture | None] = [None] * MINIMAP_BUFFERS
        self._minimap_current = 0
        self._minimap_image: np.ndarray | None = None
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

    # ---- public drawing ---------------------------------------------------------------------
    def draw(self, telemetry: Telemetry, fb_size: tuple[int, int]) -> tuple[int, int, int, int]:
        """Draw the HUD of `telemetry`'s latest frame into the bound framebuffer of size `fb_size`.

        Returns the panel rectangle (x, y, w, h) in pixels from the top-left; nothing outside it
        changes.
        """
        size = self._check_size(fb_size)
        self._check_open()
        batch = _Batch(self.font)
        height = self._build(batch, telemetry)
        x, y = self._place(size, self.width, height)
        self._render(batch.vertices((x, y)), size)
        self.last_rect = (x, y, self.width, height)
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
        batch = _Batch(self.font)
        if background is not None:
            batch.rect(x0, y0, x1, y1, background, BACK)
        for i, line in enumerate(lines):
            batch.text(line, x, y + i * lh, colour)
        self._render(batch.vertices(), size)
        return x0, y0, x1 - x0, y1 - y0

    # ---- layout (pixels relative to the panel's top-left) --------------------------------------
    def _pairs(self, b: _Batch, items: Sequence[tuple[str, str, Colour]], x: float, y: float) -> None:
        """'label value' pairs on one line: labels dim, values coloured."""
        for label, value, colour in items:
            if label:
                x = b.text(label + " ", x, y, DIM)
            x = b.text(value, x, y, colour) + self.char * 1.5

    def _build(self, b: _Batch, tel: Telemetry) -> int:
        """Queue the panel and its contents; returns the panel height."""
        pad, cw, w = self.pad, self.width - 2 * self.pad, self.width
        if tel.last is None:
            b.text("texstream telemetry: no frame recorded yet", pad, pad, DIM)
            y = pad + self.font.line_height
        else:
            y = self._content(b, tel, tel.last, tel.streamer, float(pad), float(pad), cw)
        h = int(math.ceil(y + pad))
        b.rect(0, 0, w, h, PANEL, BACK)
        for edge in ((0, 0, w, 1), (0, h - 1, w, h), (0, 1, 1, h - 1), (w - 1, 1, w, h - 1)):
            b.rect(*edge, FRAME_EDGE, BACK)
        return h

    def _place(self, fb: tuple[int, int], w: int, h: int) -> tuple[int, int]:
        m = self.margin
        x = m if self.corner.endswith("left") else max(0, fb[0] - m - w)
        y = m if self.corner.startswith("top") else max(0, fb[1] - m - h)
        return x, y

    def _swatch(self, b: _Batch, x: float, y: float, colour: Colour) -> float:
        """A small colour square vertically centred on the text line at y; returns x after it."""
        lh = self.font.line_height
        sw = max(6.0, lh * 0.5)
        b.rect(x, y + (lh - sw) / 2, x + sw, y + (lh + sw) / 2, colour)
        return x + sw + self.char * 0.4

    def _content(
        self, b: _Batch, tel: Telemetry, f: dict[str, Any], st: Streamer, x0: float, y: float, cw: float
    ) -> float:
        lh, ch = self.font.line_height, self.char
        gap = max(2.0, round(lh * 0.25))
        dts = tel.history("dt_s")[-30:]
        fps = 1.0 / float(dts.mean()) if dts.size and dts.mean() > 0 else 0.0
        x = b.text("texstream", x0, y, ACCENT) + ch
        count = len(st.textures)
        b.text(f"{count} texture{'s' if count != 1 else ''}", x, y, DIM)
        right = f"frame {f['frame']}  {fps:5.1f} fps"
        b.text(right, x0 + cw - self.font.measure(right), y, DIM)
        y += lh + gap

        # VRAM: used / budget, a bar with one segment per pool (+ page tables, ring, feedback), peak mark
        budget, vram, peak = f["budget_bytes"], f["vram_bytes"], f["vram_peak_bytes"]
        frac = vram / budget if budget else 0.0
        self._pairs(
            b,
            [
                ("VRAM", f"{_mib(vram)} / {_mib(budget)} ({frac:.0%})", WARN if frac > 0.98 else TEXT),
                ("peak", _mib(peak), TEXT),
            ],
            x0,
            y,
        )
        y += lh
        bar_h = max(6.0, round(lh * 0.6))
        b.rect(x0, y, x0 + cw, y + bar_h, GRAPH_BG, BACK)
        groups = self._vram_groups(f["vram_breakdown"], st)
        x = x0
        for _name, nbytes, colour in groups:
            w = cw * nbytes / budget if budget else 0.0
            if w > 0:
                b.rect(x, y, min(x0 + cw, x + w), y + bar_h, colour)
            x += w
        if budget:
            px = x0 + min(1.0, peak / budget) * cw
            b.rect(px - 1, y - 2, px + 1, y + bar_h + 2, TEXT, FRONT)
        y += bar_h + gap
        x = x0
        for name, nbytes, colour in groups:  # legend, wrapped
            label = f"{name} {nbytes / 2**20:.1f}"
            w = max(6.0, lh * 0.5) + ch * 0.4 + self.font.measure(label) + ch * 1.5
            if x > x0 and x + w > x0 + cw:
                x, y = x0, y + lh
            b.text(label, self._swatch(b, x, y, colour), y, DIM)
            x += w
        y += lh
        y = self._working_set(b, f, x0, y, cw, bar_h, gap)
        bias = f["mip_bias"]
        self._pairs(
            b,
            [
                ("mip bias", f"{bias:.2f}", WARN if bias > 0 else TEXT),
                ("headroom", _mib(f["headroom_bytes"]), TEXT),
                ("budget", f["budget_source"], DIM),
            ],
            x0,
            y,
        )
        y += lh + gap

        # tiles and uploads
        missing = f["missing_pages"]
        self._pairs(
            b,
            [
                ("resident", str(f["resident_tiles"]), TEXT),
                ("wanted", str(f["wanted_pages"]), TEXT),
                ("missing", str(missing), WARN if missing else TEXT),
            ],
            x0,
            y,
        )
        y += lh
        self._pairs(
            b,
            [
                ("in flight", str(f["in_flight"]), TEXT),
                ("queued", str(f["queued"]), TEXT),
                ("uploads", f"{f['uploads']}/frame", TEXT),
            ],
            x0,
            y,
        )
        y += lh
        if f["remote_packs"]:  # packs read by URL: network rate and latency, the disk cache filling
            state = ("offline", WARN) if f["net_offline"] else (f"p95 {f['net_latency_p95_ms']:.1f} ms", TEXT)
            self._pairs(
                b,
                [
                    ("net", f"{f['net_mb_s']:.1f} MB/s", TEXT),
                    ("latency", state[0], state[1]),
                    ("failed", str(f["net_failed_requests"]), WARN if f["net_failed_requests"] else TEXT),
                ],
                x0,
                y,
            )
            y += lh
            cache = (
                f"{_mib(f['cache_bytes'])} / {_mib(f['cache_capacity_bytes'])}" if f["cache_capacity_bytes"] else "off"
            )
            self._pairs(b, [("disk cache", cache, TEXT), ("hits", f"{f['cache_hit_rate']:.0%}", TEXT)], x0, y)
            y += lh
        mbs = tel.history("upload_mb_s")
        top = _nice_ceiling(max(0.1, float(np.nanmax(mbs)) if mbs.size else 0.1))
        self._pairs(b, [("upload", f"{f['upload_mb_s']:.1f} MB/s", UPLOAD_COLOUR)], x0, y)
        y += lh
        gh = float(round(lh * 2.2))
        self._bar_graph(b, mbs, top, x0, y, cw, gh, tel.history_capacity, UPLOAD_COLOUR)
        b.text(f"{top:g} MB/s", x0 + 2, y, DIM)
        y += gh + gap

        # latency, I/O, ring, feedback, evictions
        self._pairs(
            b,
            [
                ("latency p50", f"{f['latency_p50_frames']:.0f}", TEXT),
                ("p95", f"{f['latency_p95_frames']:.0f}", TEXT),
                ("p99", f"{f['latency_p99_frames']:.0f} frames", TEXT),
            ],
            x0,
            y,
        )
        y += lh
        stalls = f["ring_stalls_frame"]
        self._pairs(
            b,
            [
                ("I/O queue", f"{f['queued'] + f['in_flight']}", TEXT),
                ("ring", f"{f['ring_occupancy']:.0%}", TEXT),
                ("stalls", f"{f['ring_stalls']}", WARN if stalls else TEXT),
            ],
            x0,
            y,
        )
        y += lh
        age = f["feedback_age"]
        self._pairs(
            b,
            [
                ("feedback age", "-" if age < 0 else str(age), WARN if age > 4 else TEXT),
                ("evictions", f"{f['evictions_per_s']:.0f}/s", TEXT),
            ],
            x0,
            y,
        )
        y += lh
        corrupt = f["corrupt_tiles"]
        self._pairs(
            b,
            [
                ("re-fetched", str(f["total_refetched"]), TEXT),
                ("corrupt tiles", str(corrupt), BAD if corrupt else TEXT),
            ],
            x0,
            y,
        )
        y += lh + gap

        # timings: CPU update() as bars, GPU frame time as a line, a 60 Hz reference
        upd = tel.history("update_ms")
        gpu = _forward_fill(tel.history("gpu_ms"))
        gpu_now = float(gpu[-1]) if gpu.size and np.isfinite(gpu[-1]) else None
        self._pairs(
            b,
            [
                ("CPU update", f"{f['update_ms']:.2f} ms", CPU_COLOUR),
                ("GPU", "-" if gpu_now is None else f"{gpu_now:.2f} ms", GPU_COLOUR),
            ],
            x0,
            y,
        )
        y += lh
        finite = np.concatenate([upd[np.isfinite(upd)], gpu[np.isfinite(gpu)]])
        scale = _nice_ceiling(max(float(finite.max()) if finite.size else 1.0, 1.0))
        gh = float(round(lh * 3.0))
        self._bar_graph(b, upd, scale, x0, y, cw, gh, tel.history_capacity, CPU_COLOUR)
        if scale >= FRAME_MS_REFERENCE:
            ry = y + gh - FRAME_MS_REFERENCE / scale * gh
            b.rect(x0, ry, x0 + cw, ry + 1, (255, 255, 255, 70), FRONT)
        n = gpu.size
        if n >= 2:
            bw = cw / tel.history_capacity
            xs = x0 + cw - (n - np.arange(n) - 0.5) * bw
            ys = y + gh - np.clip(gpu / scale, 0, 1) * gh
            b.segments(xs.astype(np.float32), ys.astype(np.float32), 1.5, GPU_COLOUR)
        b.text(f"{scale:g} ms", x0 + 2, y, DIM)
        y += gh + gap

        if self.max_minimaps and st.textures:
            y = self._minimaps(b, st, x0, y, cw)
        return y

    def _working_set(
        self, b: _Batch, f: dict[str, Any], x0: float, y: float, cw: float, bar_h: float, gap: float
    ) -> float:
        """What the view wants at full detail against the cache it must fit in. The VRAM bar is full from
        the first frame (the pools take the whole budget up front); this bar shows the pressure."""
        need, room = f["working_set_bytes"], f["stream_cache_bytes"]
        frac = need / room if room else 0.0
        colour = BAD if frac > 1.0 else WARN if frac > 0.85 else WORKING_SET_COLOUR
        self._pairs(b, [("working set", f"{_mib(need)} / cache {_mib(room)} ({frac:.0%})", colour)], x0, y)
        y += self.font.line_height
        b.rect(x0, y, x0 + cw, y + bar_h, GRAPH_BG, BACK)
        if frac > 0:
            b.rect(x0, y, x0 + cw * min(1.0, frac), y + bar_h, colour)
        return y + bar_h + gap

    def _vram_groups(self, breakdown: dict[str, int], st: Streamer) -> list[tuple[str, int, Colour]]:
        pools = sorted(p.name for p in st.pools.values())
        sums = {"page tables": 0, "ring": 0, "feedback": 0, "other": 0}
        for name, nbytes in breakdown.items():
            if name in pools:
                continue
            if name.startswith("page-table"):
                sums["page tables"] += nbytes
            elif name == "staging-ring":
                sums["ring"] += nbytes
            elif name == "feedback":
                sums["feedback"] += nbytes
            else:
                sums["other"] += nbytes
        out = [
            (name.removeprefix("pool/"), breakdown.get(name, 0), POOL_COLOURS[i % len(POOL_COLOURS)])
            for i, name in enumerate(pools)
        ]
        out += [(k, v, GROUP_COLOURS[k]) for k, v in sums.items()]
        return [g for g in out if g[1] > 0]

    def _bar_graph(
        self,
        b: _Batch,
        values: np.ndarray,
        scale: float,
        x0: float,
        y0: float,
        w: float,
        h: float,
        capacity: int,
        colour: Colour,
    ) -> None:
        """Newest sample at the right; one bar per sample of a `capacity`-sample window."""
        b.rect(x0, y0, x0 + w, y0 + h, GRAPH_BG, BACK)
        n = values.size
        if not n or scale <= 0:
            return
        bw = w / capacity
        v = np.nan_to_num(values, nan=0.0)
        i = np.flatnonzero(v > 0)
        xl = (x0 + w - (n - i) * bw).astype(np.float32)
        top = (y0 + h - np.clip(v[i] / scale, 0, 1) * h).astype(np.float32)
        b.rect_array(xl, top, xl + max(bw, 1.0), np.full(top.shape, y0 + h, np.float32), colour)

    # ---- minimaps -----------------------------------------------------------------------------
    def _minimaps(self, b: _Batch, st: Streamer, x0: float, y: float, cw: float) -> float:
        lh, ch = self.font.line_height, self.char
        shown = st.textures[: self.max_minimaps]
        if self._draws % self.minimap_every == 0 or self._minimap_ids() != [vt.id for vt in shown]:
            self._update_minimaps(shown)
        x = b.text("residency", x0, y, DIM) + ch
        levels = max(vt.table.level_count for vt in shown)
        for lv in range(min(levels, len(LEVEL_COLOURS))):
            x = b.text(str(lv), self._swatch(b, x, y, _rgba(LEVEL_COLOURS[lv])), y, DIM) + ch * 0.6
        b.text("none", self._swatch(b, x, y, _rgba(NO_LEVEL_COLOUR)), y, DIM)
        y += lh + 2
        tex = self._minimap_textures[self._minimap_current]
        assert tex is not None
        aw, ah = tex.size
        x, row_h = x0, 0.0
        for vt, (_tid, ax, ay, w, h) in zip(shown, self._minimap_slots, strict=True):
            s = self.minimap_size / max(w, h)
            dw, dh = max(1.0, round(w * s)), max(1.0, round(h * s))
            label = self._ellipsize(f"#{vt.id} {Path(vt.path).name}", max(dw, ch * 10))
            cell_w = max(dw, self.font.measure(label))
            if x > x0 and x + cell_w > x0 + cw:
                x, y, row_h = x0, y + row_h, 0.0
            b.rect(x - 1, y - 1, x + dw + 1, y + dh + 1, FRAME_EDGE, FRONT)
            b.rect(
                x,
                y,
                x + dw,
                y + dh,
                (255, 255, 255, 255),
                MAP,
                MINIMAP,
                (ax / aw, ay / ah, (ax + w) / aw, (ay + h) / ah),
            )
            b.text(label, x, y + dh + 2, DIM)
            x += cell_w + ch * 1.5
            row_h = max(row_h, dh + 2 + lh + 4)
        y += row_h
        more = len(st.textures) - len(shown)
        if more > 0:
            b.text(f"+{more} more textures", x0, y, DIM)
            y += lh
        return y

    def _ellipsize(self, text: str, width: float) -> str:
        if self.font.measure(text) <= width:
            return text
        while len(text) > 1 and self.font.measure(text + "..") > width:
            text = text[:-1]
        return text + ".."

    def _minimap_ids(self) -> list[int]:
        return [slot[0] for slot in self._minimap_slots]

    def _update_minimaps(self, textures: Sequence[VirtualTexture]) -> None:
        """Recompute each texture's level-0 residency image; upload the atlas when it changed.

        Uploads rotate through `MINIMAP_BUFFERS` textures so a write never waits for a frame in
        flight that samples the previous one.
        """
        images = [self._residency_image(vt) for vt in textures]
        aw = sum(img.shape[1] + 1 for img in images)
        ah = max(img.shape[0] for img in images)
        atlas = np.zeros((ah, aw, 4), np.uint8)
        slots = []
        x = 0
        for vt, img in zip(textures, images, strict=True):
            h, w = img.shape[:2]
            atlas[:h, x : x + w] = img
            slots.append((vt.id, x, 0, w, h))
            x += w + 1
        self._minimap_slots = slots
        if self._minimap_image is not None and np.array_equal(self._minimap_image, atlas):
            return
        self._minimap_image = atlas
        self._minimap_current = (self._minimap_current + 1) % MINIMAP_BUFFERS
        tex = self._minimap_textures[self._minimap_current]
        if tex is None or tex.size != (aw, ah):
            if tex is not None:
                tex.release()
            tex = self.ctx.texture((aw, ah), 4, atlas.tobytes(), alignment=1)
            tex.filter = (moderngl.NEAREST, moderngl.NEAREST)
            tex.repeat_x = tex.repeat_y = False
            self._minimap_textures[self._minimap_current] = tex
        else:
            tex.write(atlas.tobytes(), alignment=1)

    def _residency_image(self, vt: VirtualTexture) -> np.ndarray:
        """RGBA (rows, cols, 4): the level each level-0 page samples, sampled to `minimap_pages` a side."""
        table = vt.table
        tx, ty = int(table.tiles_x[0]), int(table.tiles_y[0])
        cols = np.unique(np.linspace(0, tx - 1, min(tx, self.minimap_pages)).round().astype(np.int64))
        rows = np.unique(np.linspace(0, ty - 1, min(ty, self.minimap_pages)).round().astype(np.int64))
        yy, xx = np.meshgrid(rows, cols, indexing="ij")
        levels = table.resident_levels(np.zeros(xx.size, np.int64), xx.ravel(), yy.ravel()).reshape(xx.shape)
        img = np.empty((*levels.shape, 4), np.uint8)
        img[..., :3] = LEVEL_COLOURS[np.minimum(levels, len(LEVEL_COLOURS) - 1)]
        img[levels >= table.level_count, :3] = NO_LEVEL_COLOUR
        img[..., 3] = 255
        return img

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


def _rgba(rgb: np.ndarray) -> Colour:
    r, g, b = (int(c) for c in rgb)
    return r, g, b, 255


def _forward_fill(values: np.ndarray) -> np.ndarray:
    """NaNs replaced by the previous finite value (leading NaNs stay): GPU times arrive irregularly."""
    if not values.size:
        return values
    ok = np.isfinite(values)
    idx = np.where(ok, np.arange(values.size), 0)
    np.maximum.accumulate(idx, out=idx)
    out = values[idx]
    out[: int(np.argmax(ok)) if ok.any() else values.size] = np.nan
    return out


def _nice_ceiling(v: float) -> float:
    """The smallest of 1, 2, 5 x 10^k that is >= v."""
    k = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 5, 10):
        if m * k >= v:
            return float(m * k)
    return float(10 * k)
