"""`QuadBatch`: the HUD's rectangles, polylines and glyphs as one triangle list (numpy, no GL).

Quads are collected in layers drawn back to front; `vertices()` turns them into `VERTEX` records
(position, texture coordinate, colour, mode) in one vectorized pass, for one draw call.
"""

from __future__ import annotations

import numpy as np

from .font import GlyphAtlas

__all__ = [
    "BACK",
    "FRONT",
    "GLYPH",
    "LAYERS",
    "MAP",
    "MID",
    "MINIMAP",
    "SOLID",
    "TEXT_LAYER",
    "VERTEX",
    "Colour",
    "QuadBatch",
]

Colour = tuple[int, int, int, int]
SOLID, GLYPH, MINIMAP = 0.0, 1.0, 2.0  # fragment modes: flat colour, font atlas, minimap atlas
VERTEX = np.dtype([("pos", np.float32, 2), ("uv", np.float32, 2), ("color", np.uint8, 4), ("mode", np.float32)])
_TRIANGLES = np.array([0, 1, 2, 0, 2, 3])
LAYERS = 5
BACK, MID, FRONT, MAP, TEXT_LAYER = range(LAYERS)  # drawn in this order


class QuadBatch:
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
