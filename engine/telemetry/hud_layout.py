"""The telemetry HUD's layout: what goes where in the panel, as quads in one vertex array. No GL.

`HudLayout` turns a `Telemetry`'s latest `FrameRecord` (and the streamer's read-only views: its
textures, pools and page tables) into a `QuadBatch` of rectangles, graph bars, polylines and glyphs
in pixels from the panel's top-left, and the residency minimaps into one RGBA atlas image
(`MinimapAtlas`). `Overlay` (overlay.py) owns the GL side: it uploads the atlas and the vertices and
draws them in one call. Everything here is plain numpy and Pillow, testable without a context.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .font import GlyphAtlas, load_font
from .quads import BACK, FRONT, MAP, MINIMAP, Colour, QuadBatch

if TYPE_CHECKING:
    from ..runtime.streamer import Streamer, VirtualTexture
    from .schema import FrameRecord
    from .stats import Telemetry

__all__ = ["LEVEL_COLOURS", "NO_LEVEL_COLOUR", "HudLayout", "MinimapAtlas", "MinimapCell"]

CORNERS = ("top-left", "top-right", "bottom-left", "bottom-right")

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


@dataclass(frozen=True)
class MinimapCell:
    """One texture's residency image inside the minimap atlas (pixels)."""

    texture_id: int
    x: int
    y: int
    width: int
    height: int


@dataclass(frozen=True)
class MinimapAtlas:
    """The residency images of the textures shown, side by side in one RGBA image."""

    image: np.ndarray  # (height, width, 4) uint8
    cells: tuple[MinimapCell, ...]

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the atlas image."""
        return int(self.image.shape[1]), int(self.image.shape[0])

    @property
    def texture_ids(self) -> list[int]:
        return [c.texture_id for c in self.cells]


def _size_label(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 10 * 2**30 else f"{n / 2**20:.1f} MiB"


class HudLayout:
    """Where everything in the HUD panel goes (see `Overlay` for the parameters' meaning)."""

    def __init__(
        self,
        *,
        font_size: float = 13,
        corner: str = "top-left",
        margin: int = 8,
        minimap_pages: int = 128,
        minimap_size: int = 96,
        max_minimaps: int = 6,
    ) -> None:
        if corner not in CORNERS:
            raise ValueError(f"corner must be top-left, top-right, bottom-left or bottom-right, got {corner!r}")
        if margin < 0 or minimap_pages < 1 or minimap_size < 8 or max_minimaps < 0:
            raise ValueError(
                f"bad overlay layout: margin {margin!r}, minimap_pages {minimap_pages!r}, "
                f"minimap_size {minimap_size!r}, max_minimaps {max_minimaps!r}"
            )
        self.corner, self.margin = corner, margin
        self.minimap_pages, self.minimap_size, self.max_minimaps = minimap_pages, minimap_size, max_minimaps
        font, name = load_font(font_size)
        self.font = GlyphAtlas(font, name)
        self.pad = max(4, round(font_size * 0.6))
        self.char = float(self.font.advance[ord("0")]) or font_size * 0.6
        self.width = int(round(44 * self.char)) + 2 * self.pad

    def build(self, b: QuadBatch, tel: Telemetry, atlas: MinimapAtlas | None = None) -> int:
        """Queue the panel and its contents for `tel`'s latest frame into `b` (pixels from the panel's
        top-left); `atlas` places the residency minimaps. Returns the panel height."""
        pad, cw, w = self.pad, self.width - 2 * self.pad, self.width
        if tel.last is None:
            b.text("texstream telemetry: no frame recorded yet", pad, pad, DIM)
            y = pad + self.font.line_height
        else:
            y = self._content(b, tel, tel.last, tel.streamer, atlas, float(pad), float(pad), cw)
        h = int(math.ceil(y + pad))
        b.rect(0, 0, w, h, PANEL, BACK)
        for edge in ((0, 0, w, 1), (0, h - 1, w, h), (0, 1, 1, h - 1), (w - 1, 1, w, h - 1)):
            b.rect(*edge, FRAME_EDGE, BACK)
        return h

    def place(self, fb: tuple[int, int], w: int, h: int) -> tuple[int, int]:
        m = self.margin
        x = m if self.corner.endswith("left") else max(0, fb[0] - m - w)
        y = m if self.corner.startswith("top") else max(0, fb[1] - m - h)
        return x, y

    # ---- minimaps -----------------------------------------------------------------------------
    def minimap_atlas(self, textures: Sequence[VirtualTexture]) -> MinimapAtlas:
        """Each texture's level-0 residency image (`residency_image`), side by side, 1 px apart."""
        images = [self.residency_image(vt) for vt in textures]
        aw = sum(img.shape[1] + 1 for img in images)
        ah = max(img.shape[0] for img in images)
        atlas = np.zeros((ah, aw, 4), np.uint8)
        cells = []
        x = 0
        for vt, img in zip(textures, images, strict=True):
            h, w = img.shape[:2]
            atlas[:h, x : x + w] = img
            cells.append(MinimapCell(vt.id, x, 0, w, h))
            x += w + 1
        return MinimapAtlas(atlas, tuple(cells))

    def residency_image(self, vt: VirtualTexture) -> np.ndarray:
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

    # ---- panel contents (pixels relative to the panel's top-left) -----------------------------
    def _pairs(self, b: QuadBatch, items: Sequence[tuple[str, str, Colour]], x: float, y: float) -> None:
        """'label value' pairs on one line: labels dim, values coloured."""
        for label, value, colour in items:
            if label:
                x = b.text(label + " ", x, y, DIM)
            x = b.text(value, x, y, colour) + self.char * 1.5

    def _swatch(self, b: QuadBatch, x: float, y: float, colour: Colour) -> float:
        """A small colour square vertically centred on the text line at y; returns x after it."""
        lh = self.font.line_height
        sw = max(6.0, lh * 0.5)
        b.rect(x, y + (lh - sw) / 2, x + sw, y + (lh + sw) / 2, colour)
        return x + sw + self.char * 0.4

    def _content(
        self,
        b: QuadBatch,
        tel: Telemetry,
        f: FrameRecord,
        st: Streamer,
        atlas: MinimapAtlas | None,
        x0: float,
        y: float,
        cw: float,
    ) -> float:
        lh, ch = self.font.line_height, self.char
        gap = max(2.0, round(lh * 0.25))
        dts = tel.history("dt_s")[-30:]
        fps = 1.0 / float(dts.mean()) if dts.size and dts.mean() > 0 else 0.0
        x = b.text("texstream", x0, y, ACCENT) + ch
        count = len(st.textures)
        b.text(f"{count} texture{'s' if count != 1 else ''}", x, y, DIM)
        right = f"frame {f.frame}  {fps:5.1f} fps"
        b.text(right, x0 + cw - self.font.measure(right), y, DIM)
        y += lh + gap

        # VRAM: used / budget, a bar with one segment per pool (+ page tables, ring, feedback), peak mark
        budget, vram, peak = f.budget_bytes, f.vram_bytes, f.vram_peak_bytes
        frac = vram / budget if budget else 0.0
        self._pairs(
            b,
            [
                ("VRAM", f"{_size_label(vram)} / {_size_label(budget)} ({frac:.0%})", WARN if frac > 0.98 else TEXT),
                ("peak", _size_label(peak), TEXT),
            ],
            x0,
            y,
        )
        y += lh
        bar_h = max(6.0, round(lh * 0.6))
        b.rect(x0, y, x0 + cw, y + bar_h, GRAPH_BG, BACK)
        groups = self._vram_groups(f.vram_breakdown, st)
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
        bias = f.mip_bias
        self._pairs(
            b,
            [
                ("mip bias", f"{bias:.2f}", WARN if bias > 0 else TEXT),
                ("headroom", _size_label(f.headroom_bytes), TEXT),
                ("budget", f.budget_source, DIM),
            ],
            x0,
            y,
        )
        y += lh + gap

        # tiles and uploads
        missing = f.missing_pages
        self._pairs(
            b,
            [
                ("resident", str(f.resident_tiles), TEXT),
                ("wanted", str(f.wanted_pages), TEXT),
                ("missing", str(missing), WARN if missing else TEXT),
            ],
            x0,
            y,
        )
        y += lh
        self._pairs(
            b,
            [
                ("in flight", str(f.in_flight), TEXT),
                ("queued", str(f.queued), TEXT),
                ("uploads", f"{f.uploads}/frame", TEXT),
            ],
            x0,
            y,
        )
        y += lh
        if f.remote_packs:  # packs read by URL: network rate and latency, the disk cache filling
            state = ("offline", WARN) if f.net_offline else (f"p95 {f.net_latency_p95_ms:.1f} ms", TEXT)
            self._pairs(
                b,
                [
                    ("net", f"{f.net_mb_s:.1f} MB/s", TEXT),
                    ("latency", state[0], state[1]),
                    ("failed", str(f.net_failed_requests), WARN if f.net_failed_requests else TEXT),
                ],
                x0,
                y,
            )
            y += lh
            cache = (
                f"{_size_label(f.cache_bytes)} / {_size_label(f.cache_capacity_bytes)}"
                if f.cache_capacity_bytes
                else "off"
            )
            self._pairs(b, [("disk cache", cache, TEXT), ("hits", f"{f.cache_hit_rate:.0%}", TEXT)], x0, y)
            y += lh
        mbs = tel.history("upload_mb_s")
        top = _nice_ceiling(max(0.1, float(np.nanmax(mbs)) if mbs.size else 0.1))
        self._pairs(b, [("upload", f"{f.upload_mb_s:.1f} MB/s", UPLOAD_COLOUR)], x0, y)
        y += lh
        gh = float(round(lh * 2.2))
        self._bar_graph(b, mbs, top, x0, y, cw, gh, tel.history_capacity, UPLOAD_COLOUR)
        b.text(f"{top:g} MB/s", x0 + 2, y, DIM)
        y += gh + gap

        # latency, I/O, ring, feedback, evictions
        self._pairs(
            b,
            [
                ("latency p50", f"{f.latency_p50_frames:.0f}", TEXT),
                ("p95", f"{f.latency_p95_frames:.0f}", TEXT),
                ("p99", f"{f.latency_p99_frames:.0f} frames", TEXT),
            ],
            x0,
            y,
        )
        y += lh
        stalls = f.ring_stalls_frame
        self._pairs(
            b,
            [
                ("I/O queue", f"{f.queued + f.in_flight}", TEXT),
                ("ring", f"{f.ring_occupancy:.0%}", TEXT),
                ("stalls", f"{f.ring_stalls}", WARN if stalls else TEXT),
            ],
            x0,
            y,
        )
        y += lh
        age = f.feedback_age
        self._pairs(
            b,
            [
                ("feedback age", "-" if age < 0 else str(age), WARN if age > 4 else TEXT),
                ("evictions", f"{f.evictions_per_s:.0f}/s", TEXT),
            ],
            x0,
            y,
        )
        y += lh
        corrupt = f.corrupt_tiles
        self._pairs(
            b,
            [
                ("re-fetched", str(f.total_refetched), TEXT),
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
                ("CPU update", f"{f.update_ms:.2f} ms", CPU_COLOUR),
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
            y = self._minimaps(b, st, atlas, x0, y, cw)
        return y

    def _working_set(
        self, b: QuadBatch, f: FrameRecord, x0: float, y: float, cw: float, bar_h: float, gap: float
    ) -> float:
        """What the view wants at full detail against the cache it must fit in. The VRAM bar is full from
        the first frame (the pools take the whole budget up front); this bar shows the pressure."""
        need, room = f.working_set_bytes, f.stream_cache_bytes
        frac = need / room if room else 0.0
        colour = BAD if frac > 1.0 else WARN if frac > 0.85 else WORKING_SET_COLOUR
        self._pairs(
            b, [("working set", f"{_size_label(need)} / cache {_size_label(room)} ({frac:.0%})", colour)], x0, y
        )
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
            elif name.startswith("staging-"):  # the host ring and the device buffer
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
        b: QuadBatch,
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

    def _minimaps(
        self, b: QuadBatch, st: Streamer, atlas: MinimapAtlas | None, x0: float, y: float, cw: float
    ) -> float:
        lh, ch = self.font.line_height, self.char
        shown = st.textures[: self.max_minimaps]
        x = b.text("residency", x0, y, DIM) + ch
        levels = max(vt.table.level_count for vt in shown)
        for lv in range(min(levels, len(LEVEL_COLOURS))):
            x = b.text(str(lv), self._swatch(b, x, y, _rgba(LEVEL_COLOURS[lv])), y, DIM) + ch * 0.6
        b.text("none", self._swatch(b, x, y, _rgba(NO_LEVEL_COLOUR)), y, DIM)
        y += lh + 2
        if atlas is None:
            return y
        aw, ah = atlas.size
        x, row_h = x0, 0.0
        for vt, cell in zip(shown, atlas.cells, strict=True):
            ax, ay, w, h = cell.x, cell.y, cell.width, cell.height
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
