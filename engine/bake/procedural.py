"""Procedural sources of any size (65536^2 and beyond), generated row band by row band.

Every pattern is a pure function of (pattern, seed, texel coordinates, image size): a band of rows
generated alone equals the same rows of a larger generation, whichever process makes it, so the
baker's workers generate their own bands in parallel. Randomness comes from an integer hash of
lattice coordinates (no global state, no random generator objects).

Patterns:

terrain  The default demo asset. A fractal height field (fBm) made by hierarchical synthesis:
         white noise on a lattice of spacing 2^k is upsampled to spacing 2^(k-1) by quadratic
         B-spline subdivision (Chaikin: weights 3/4, 1/4) and the next octave's noise added, from
         spacing size/4 down to 2 texels, then subdivided once more to texels. Each octave is
         evaluated at its own resolution (all octaves above texel size cost a third of one
         full-resolution pass together) and the field is C1-smooth. Octave amplitudes grow with
         their spacing (Hurst exponent 0.9), so slopes, and the hill shading that shows them,
         exist at every scale: relief is visible from the whole-texture view down to single
         texels. Slopes steepen with altitude (rugged mountains, gentle lowlands). Colour comes
         from one table indexed by (height, Lambert term, slope): depth-tinted water (the sea
         bed's relief showing faintly through it), sand, meadow, grass, forest, scrub, rock on
         steep slopes, snow on high ground that is not too steep; the sun is low in the
         north-west. Per texel the work is one subdivision, central differences, a few
         arithmetic passes and one table gather, on strips small enough to stay in cache.
normals  The same height field's normals, (x, y, z) * 0.5 + 0.5 in R, G, B (A = 255), water flat:
         the companion normal map for BC5 (which keeps R, G) of the terrain with the same seed
         and size. Its slopes are the unexaggerated ones (the terrain's colour table exaggerates
         the relief of high ground for shading only).
checker  A debugging grid: 128-texel cells (one default tile) in alternating hashed colours, each
         labelled "x,y" with its cell coordinates, and 1024-texel blocks labelled "x,y" in large
         type that stays readable down to level 3; thin lines every 128 texels, thick red ones
         every 1024.

The terrain and normal map's loops (lattice noise, subdivision, the per-texel work) run in the
compiled helper (engine/native/_native.c) when it is built, else in numpy here: both give the same
bits (`use_generator_loops` picks one, for tests and benchmarks).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from ..errors import SourceError
from ..pack.format import MAX_DIMENSION

if TYPE_CHECKING:
    from ..native import ProceduralFunctions

log = logging.getLogger(__name__)

PATTERNS = ("terrain", "normals", "checker")

_STRIP_TEXELS = 1 << 23  # texels per fBm band (its lattice down to spacing 2 is ~8 MiB of float32)
_HURST = 0.9
_SLOPE = 0.18  # height units per texel of one octave's unit amplitude at spacing 1: sets the relief

_M1 = np.uint32(0x2C1B3C6D)
_M2 = np.uint32(0x297A2D39)
_CX = np.uint32(0x27D4EB2D)
_CY = np.uint32(0x165667B1)


_loops_kind = "auto"
_loops_library: str | None = None


def use_generator_loops(kind: str, library: str | None = None) -> tuple[str, str | None]:
    """Pick the terrain and normal map's loops in this process: "auto" (default: the compiled helper
    when it is built), "native" (the compiled helper, or the build at `library`; an error when it is
    missing) or "numpy". Returns the previous ``(kind, library)``, to restore it."""
    global _loops_kind, _loops_library
    if kind not in ("auto", "native", "numpy"):
        raise ValueError(f"generator loops must be auto, native or numpy, got {kind!r}")
    previous = (_loops_kind, _loops_library)
    _loops_kind, _loops_library = kind, library
    return previous


def _compiled() -> ProceduralFunctions | None:
    if _loops_kind == "numpy":
        return None
    from ..native import procedural_functions

    functions = procedural_functions(_loops_library)
    if functions is None and _loops_kind == "native":
        raise RuntimeError("the compiled helper's procedural generator loops are not available")
    return functions


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


# ---- hashing -------------------------------------------------------------------------------------------
def _mix(h: np.ndarray) -> np.ndarray:
    """In-place integer finaliser (xorshift-multiply) on uint32."""
    h ^= h >> np.uint32(15)
    h *= _M1
    h ^= h >> np.uint32(12)
    h *= _M2
    h ^= h >> np.uint32(15)
    return h


def _salt(seed: int, stream: int) -> np.uint32:
    v = np.array([(seed * 0x9E3779B1 + stream * 0x85EBCA77) & 0xFFFFFFFF], np.uint32)
    return _mix(_mix(v))[0]


def lattice_noise(rows: np.ndarray, cols: np.ndarray, salt: np.uint32) -> np.ndarray:
    """White noise in [-1, 1) at integer lattice points (rows x cols), float32; a pure function."""
    hy = _mix(rows.astype(np.int64).astype(np.uint32) * _CY ^ salt)
    hx = cols.astype(np.int64).astype(np.uint32) * _CX
    h = _mix(hy[:, None] ^ hx[None, :])
    out = (h >> np.uint32(8)).astype(np.float32)
    out *= np.float32(2.0 / (1 << 24))
    out -= np.float32(1.0)
    return out


# ---- hierarchical fBm ----------------------------------------------------------------------------------
def _parent_range(lo: int, hi: int) -> tuple[int, int]:
    """Coarse lattice indices whose subdivision covers fine indices [lo, hi)."""
    return (lo - 1) // 2, (hi - 2) // 2 + 2


def _subdivide(c: np.ndarray, c0: int, lo: int, hi: int, axis: int) -> np.ndarray:
    """Chaikin subdivision along `axis` (0 or 1): coarse samples from index c0 -> fine [lo, hi).

    Fine 2i+1 = 3/4 c[i] + 1/4 c[i+1] and fine 2i+2 = 1/4 c[i] + 3/4 c[i+1]: coarse sample i sits
    at the centre of fine texels 2i and 2i+1, so every lattice is centred on texel centres.
    Only the coarse samples that [lo, hi) needs are touched.
    """
    k0, k1 = _parent_range(lo, hi)
    c = c[k0 - c0 : k1 - c0] if axis == 0 else c[:, k0 - c0 : k1 - c0]
    a, b = (c[:-1], c[1:]) if axis == 0 else (c[:, :-1], c[:, 1:])
    q = b - a
    q *= np.float32(0.25)
    shape = list(a.shape)
    shape[axis] *= 2
    fine = np.empty(shape, np.float32)
    if axis == 0:
        np.add(a, q, out=fine[0::2])
        np.subtract(b, q, out=fine[1::2])
    else:
        np.add(a, q, out=fine[:, 0::2])
        np.subtract(b, q, out=fine[:, 1::2])
    first = lo - (2 * k0 + 1)  # fine[0] is fine index 2*k0 + 1
    return fine[first : first + hi - lo] if axis == 0 else fine[:, first : first + hi - lo]


def _top_octave(size: int) -> int:
    return max(1, int(math.log2(max(size, 4))) - 2)  # coarsest spacing: a quarter of the image


def fbm_lattice(r0: int, r1: int, c0: int, c1: int, level: int, size: int, seed: int) -> np.ndarray:
    """The fBm summed down to lattice `level` (spacing 2^level), at its lattice points [r0, r1) x [c0, c1).

    Octave k (spacing 2^k, from size/4 down to `level`) is hashed white noise of amplitude
    _SLOPE * 2^(k * hurst), carried down by subdivision. A pure function of its arguments.
    """
    top = max(level, _top_octave(size))
    ranges = [(r0, r1, c0, c1)]
    for _ in range(top - level):
        a0, a1, b0, b1 = ranges[-1]
        ranges.append(_parent_range(a0, a1) + _parent_range(b0, b1))
    native = _compiled()
    g: np.ndarray | None = None
    for k in range(top, level - 1, -1):
        a0, a1, b0, b1 = ranges[k - level]
        amplitude = np.float32(_SLOPE * (1 << k) ** _HURST)
        if native is None:
            n = lattice_noise(np.arange(a0, a1), np.arange(b0, b1), _salt(seed, k))
            n *= amplitude
        else:
            n = np.empty((a1 - a0, b1 - b0), np.float32)
            native.lattice_noise(
                a0, a1 - a0, b0, b1 - b0, int(_salt(seed, k)), float(amplitude), n.ctypes.data, b1 - b0
            )
        if g is not None:
            p0, _, q0, _ = ranges[k - level + 1]
            if native is None:
                n += _subdivide(_subdivide(g, p0, a0, a1, 0), q0, b0, b1, 1)
            else:
                tmp = np.empty(3 * g.shape[1] + 4, np.float32)
                rows, cols = g.shape
                done = native.subdivide_add(
                    g.ctypes.data,
                    rows,
                    cols,
                    cols,
                    p0,
                    q0,
                    a0,
                    a1,
                    b0,
                    b1,
                    tmp.ctypes.data,
                    tmp.size,
                    n.ctypes.data,
                    b1 - b0,
                )
                if done != 0:
                    raise AssertionError(f"lattice {p0},{q0} {g.shape} does not cover {a0}..{a1} x {b0}..{b1}")
        g = n
    assert g is not None
    return g


def fbm(y0: int, y1: int, x0: int, x1: int, size: int, seed: int) -> np.ndarray:
    """Height field on texels [y0, y1) x [x0, x1): octaves down to 2 texels, subdivided to texels."""
    r0, r1 = _parent_range(y0, y1)
    c0, c1 = _parent_range(x0, x1)
    g1 = fbm_lattice(r0, r1, c0, c1, 1, size, seed)
    return _subdivide(_subdivide(g1, r0, y0, y1, 0), c0, x0, x1, 1)


def _height_scale(size: int) -> float:
    """About the standard deviation of the field: heights / this lie mostly in [-1, 1]."""
    top = _top_octave(size)
    var = sum((_SLOPE * (1 << k) ** _HURST) ** 2 for k in range(1, top + 1)) / 3 * 0.55
    return math.sqrt(var)


class _Field:
    """Height and central-difference slopes of texel rows, one L2-sized strip at a time.

    The fBm down to spacing 2 is computed once for the whole band; the last subdivision (to texel
    spacing) and the per-texel work run on strips of a few rows so temporaries stay in cache.
    """

    def __init__(self, y0: int, y1: int, width: int, size: int, seed: int) -> None:
        self.y0, self.y1 = y0, y1
        self.width = width
        # Texels [y0-1, y1+1) x [-1, width+1): a one-texel margin for the differences.
        self.r0, r1 = _parent_range(y0 - 1, y1 + 1)
        self.c0, c1 = _parent_range(-1, width + 1)
        self.g1 = fbm_lattice(self.r0, r1, self.c0, c1, 1, size, seed)

    def strip(self, ys: int, ye: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        g = _subdivide(self.g1, self.r0, ys - 1, ye + 1, 0)
        g = _subdivide(g, self.c0, -1, self.width + 1, 1)
        h = g[1:-1, 1:-1]
        dx = g[1:-1, 2:] - g[1:-1, :-2]  # 2 * d/dx
        dy = g[2:, 1:-1] - g[:-2, 1:-1]
        return h, dx, dy

    def rows_native(
        self, native: ProceduralFunctions, mode: int, out: np.ndarray, k: np.ndarray, table: np.ndarray | None = None
    ) -> None:
        """All the band's rows into `out` ((rows, width, 4) uint8) by ``ts_height_rows``: `mode` is
        terrain (0, colours from `table`) or normals (1); `k` the terrain's float32 constants."""
        rows, cols = self.g1.shape
        scratch = np.empty(cols + 4 * (self.width + 4), np.float32)
        bins = np.array([_H_BINS, _S_BINS, _L_BINS], np.int64)
        done = native.height_rows(
            self.g1.ctypes.data,
            rows,
            cols,
            cols,
            self.r0,
            self.c0,
            self.y0,
            self.y1,
            self.width,
            mode,
            k.ctypes.data,
            bins.ctypes.data,
            _ptr(table),
            0 if table is None else table.size,
            out.ctypes.data,
            out.strides[0],
            scratch.ctypes.data,
            scratch.size,
        )
        if done != 0:
            raise AssertionError(f"the field of rows {self.y0}..{self.y1} does not cover them")


def _strip_rows(width: int) -> int:
    return max(1, min(64, (1 << 18) // max(1, width)))


# ---- terrain colour ----------------------------------------------------------------------------------------
_TERRAIN_STOPS = [  # normalized height (about N(0, 1)) -> sRGB colour
    (-2.2, (4, 14, 40)),
    (-1.2, (8, 28, 70)),
    (-0.5, (18, 58, 106)),
    (-0.12, (36, 96, 136)),
    (-0.02, (62, 126, 148)),
    (0.00, (198, 186, 140)),  # wet sand
    (0.04, (192, 180, 126)),  # beach
    (0.09, (118, 150, 70)),  # meadow
    (0.45, (80, 124, 50)),  # grass
    (0.80, (48, 90, 40)),  # forest
    (1.05, (78, 90, 56)),  # upland scrub
    (1.25, (112, 102, 86)),  # bare high ground
    (1.45, (140, 134, 126)),
    (2.2, (150, 146, 140)),
]
_ROCK = (112, 104, 96)
_CLIFF = (92, 84, 78)
_SNOW = (240, 243, 248)
_H_BINS, _S_BINS, _L_BINS = 512, 64, 16  # height, shade, slope bins of the colour table
_H_LO, _H_HI = -2.2, 2.2
_RELIEF_FROM, _RELIEF_GAIN = 0.45, 2.2  # slopes steepen with altitude above sea level: rugged mountains
_SLOPE_MAX = 2.0  # slope (rise over run) mapped to the last slope bin
_SUN = np.array([-0.55, -0.45, 0.70]) / np.linalg.norm([-0.55, -0.45, 0.70])
_AMBIENT = 0.32
_SEABED = 0.3  # how much of the sea bed's relief shows through the water


def _smooth(x: np.ndarray, a: float, b: float) -> np.ndarray:
    t = np.clip((x - a) / (b - a), 0.0, 1.0)
    return t * t * (3 - 2 * t)


@lru_cache(maxsize=1)
def _terrain_table() -> np.ndarray:
    """uint32[H * S * L]: packed RGBA8 for (height bin, shade bin, slope bin), all shading baked in."""
    hs = np.linspace(_H_LO, _H_HI, _H_BINS)
    xs = np.array([s[0] for s in _TERRAIN_STOPS])
    cs = np.array([s[1] for s in _TERRAIN_STOPS], np.float64)
    base = np.stack([np.interp(hs, xs, cs[:, c]) for c in range(3)], axis=1)  # (H, 3)
    slope = (np.arange(_L_BINS) + 0.5) / _L_BINS * _SLOPE_MAX  # (L,)
    shade = np.arange(_S_BINS) / (_S_BINS - 1)  # (S,) Lambert term in [0, 1]
    h = hs[:, None, None]
    sl = slope[None, None, :]
    col = np.broadcast_to(base[:, None, None, :], (_H_BINS, 1, _L_BINS, 3)).copy()
    land = (h > 0)[..., None]
    rock = (_smooth(sl, 0.45, 0.9) * (h > 0.03))[..., None]
    col = col + (np.array(_ROCK) - col) * rock
    cliff = (_smooth(sl, 1.1, 1.9) * (h > 0.03))[..., None]
    col = col + (np.array(_CLIFF) - col) * cliff
    snow = (_smooth(h, 1.42, 1.56) * (1 - _smooth(sl, 0.7, 1.3)))[..., None]
    col = col + (np.array(_SNOW) - col) * snow
    light = _AMBIENT + (1 - _AMBIENT) * 1.25 * shade[None, :, None, None]
    flat = _AMBIENT + (1 - _AMBIENT) * 1.25 * _SUN[2]
    water = flat + _SEABED * (light - flat)  # the surface is flat; the sea bed shows through faintly
    lit = np.where(land, col * light, col * water)
    rgba = np.empty(lit.shape[:3] + (4,), np.uint8)
    rgba[..., :3] = np.clip(np.rint(lit), 0, 255)
    rgba[..., 3] = 255
    return rgba.reshape(-1, 4).view(np.uint32).ravel()


_TS_TERRAIN, _TS_NORMALS = 0, 1  # ts_height_rows's modes


def _band_out(out: np.ndarray | None, y0: int, y1: int, width: int) -> np.ndarray:
    if out is None:
        return np.empty((y1 - y0, width, 4), np.uint8)
    if out.shape != (y1 - y0, width, 4) or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous ({y1 - y0}, {width}, 4) uint8 array")
    return out


def terrain_rows(y0: int, y1: int, width: int, height: int, seed: int, out: np.ndarray | None = None) -> np.ndarray:
    """Terrain colour rows [y0, y1): (rows, width, 4) uint8, written into `out` when given."""
    size = max(width, height)
    rgba = _band_out(out, y0, y1, width)
    field = _Field(y0, y1, width, size, seed)
    table = _terrain_table()
    inv = 1.0 / _height_scale(size)
    h_mul = np.float32((_H_BINS - 1) * inv / (_H_HI - _H_LO))
    h_add = np.float32(-_H_LO * (_H_BINS - 1) / (_H_HI - _H_LO) + 0.5)
    sx, sy, sz = (np.float32(v) for v in _SUN)
    r_mul = np.float32(0.5 * _RELIEF_GAIN * inv)  # central differences are 2x the slope
    r_lo = np.float32(_RELIEF_FROM / inv)
    native = _compiled()
    if native is not None:
        k = np.array(
            [r_lo, r_mul, -sx, sy, sz, h_mul, h_add, _S_BINS - 1, _L_BINS / _SLOPE_MAX, _L_BINS - 1], np.float32
        )
        field.rows_native(native, _TS_TERRAIN, rgba, k, table)
        return rgba
    out = rgba.view(np.uint32).reshape(y1 - y0, width)
    step = _strip_rows(width)
    for ys in range(y0, y1, step):
        ye = min(y1, ys + step)
        h, dx, dy = field.strip(ys, ye)
        relief = np.maximum(h, r_lo)
        relief -= r_lo
        relief *= r_mul
        relief += np.float32(0.5)
        dx *= relief
        dy *= relief
        s2 = dx * dx
        s2 += dy * dy
        # Lambert term n.L with n = (-dx, -dy, 1) / |.|, in [0, 1].
        lam = dx * (-sx)
        lam -= dy * sy
        lam += sz
        s2 += np.float32(1.0)
        np.sqrt(s2, out=s2)  # |n| (unnormalized), >= 1
        lam /= s2
        np.clip(lam, 0.0, 1.0, out=lam)
        # Slope bin from |n| = sqrt(1 + slope^2): slope = sqrt(|n|^2 - 1).
        s2 *= s2
        s2 -= np.float32(1.0)
        np.sqrt(s2, out=s2)
        idx = (h * h_mul + h_add).astype(np.int32)
        np.clip(idx, 0, _H_BINS - 1, out=idx)
        idx *= _S_BINS * _L_BINS
        lam *= np.float32(_S_BINS - 1)
        lam += np.float32(0.5)
        si = lam.astype(np.int32)
        si *= _L_BINS
        idx += si
        s2 *= np.float32(_L_BINS / _SLOPE_MAX)
        np.minimum(s2, np.float32(_L_BINS - 1), out=s2)
        idx += s2.astype(np.int32)
        np.take(table, idx, out=out[ys - y0 : ye - y0], mode="clip")
    return rgba


def normal_rows(y0: int, y1: int, width: int, height: int, seed: int, out: np.ndarray | None = None) -> np.ndarray:
    """Normal map rows [y0, y1): (rows, width, 4) uint8, written into `out` when given."""
    size = max(width, height)
    out = _band_out(out, y0, y1, width)
    field = _Field(y0, y1, width, size, seed)
    native = _compiled()
    if native is not None:
        field.rows_native(native, _TS_NORMALS, out, np.zeros(10, np.float32))
        return out
    out[..., 3] = 255
    step = _strip_rows(width)
    for ys in range(y0, y1, step):
        ye = min(y1, ys + step)
        h, dx, dy = field.strip(ys, ye)
        land = h > 0  # water is flat
        dx *= np.float32(0.5) * land
        dy *= np.float32(0.5) * land
        inv = np.float32(1.0) / np.sqrt(dx * dx + dy * dy + np.float32(1.0))
        o = out[ys - y0 : ye - y0]
        for c, v in enumerate((-dx * inv, -dy * inv, inv)):
            v += np.float32(1.0)
            v *= np.float32(127.5)
            v += np.float32(0.5)
            np.clip(v, 0.0, 255.0, out=v)
            o[..., c] = v
    return out


_FONT = {  # 3x5 glyphs, rows top to bottom, bit 2 = left column
    "0": (7, 5, 5, 5, 7),
    "1": (2, 6, 2, 2, 7),
    "2": (7, 1, 7, 4, 7),
    "3": (7, 1, 3, 1, 7),
    "4": (5, 5, 7, 1, 1),
    "5": (7, 4, 7, 1, 7),
    "6": (7, 4, 7, 5, 7),
    "7": (7, 1, 2, 2, 2),
    "8": (7, 5, 7, 5, 7),
    "9": (7, 5, 7, 1, 7),
    ",": (0, 0, 0, 2, 4),
}
_GLYPHS = np.array([_FONT[str(d)] for d in range(10)] + [_FONT[","]], np.int64)  # 10 = comma
_CELL = 128  # checker cell: one tile of the default size
_BLOCK = 1024  # labelled block: readable down to level 3


def _label_row(v: int, width: int, period: int, scale: int, offset: int, coord_y: int, digits: int) -> np.ndarray:
    """Texels of one row that belong to the labels "x,y" written every `period` texels.

    `v` is the row inside its cell, `coord_y` the cell's row number; glyphs are 3x5 at `scale`.
    """
    gv = (v - offset) // scale
    if not 0 <= gv < 5 or v < offset:
        return np.zeros(width, bool)
    xs = np.arange(width)
    u = xs % period - offset
    adv = 4 * scale
    ch = u // adv
    gu = (u % adv) // scale
    inside = (u >= 0) & (ch < 2 * digits + 1) & (gu < 3)
    number = np.where(ch < digits, xs // period, coord_y)
    place = np.where(ch < digits, digits - 1 - ch, 2 * digits - ch)
    digit = (number // 10 ** np.clip(place, 0, digits - 1)) % 10
    glyph = np.where(ch == digits, 10, digit)
    bits = _GLYPHS[np.clip(glyph, 0, 10), gv]
    return inside & ((bits >> (2 - np.clip(gu, 0, 2))) & 1).astype(bool)


def checker_rows(y0: int, y1: int, width: int, height: int, seed: int, out: np.ndarray | None = None) -> np.ndarray:
    """Checker rows [y0, y1): (rows, width, 4) uint8, written into `out` when given."""
    out = _band_out(out, y0, y1, width)
    out[..., 3] = 255
    n_cells = -(-width // _CELL)
    cell_digits = len(str(max(1, -(-max(width, height) // _CELL) - 1)))
    block_digits = len(str(max(1, -(-max(width, height) // _BLOCK) - 1)))
    cx = np.arange(n_cells)
    phase = np.array([0.0, 1 / 3, 2 / 3])
    for cy in range(y0 // _CELL, (y1 - 1) // _CELL + 1):
        # One row of cells: hashed hue, alternating light and dark.
        hue = (lattice_noise(np.array([cy]), cx, _salt(seed, 99))[0] + 1.0) * 0.5
        light = (cx + cy) % 2 == 0
        rgb = 0.5 + 0.5 * np.cos(2 * np.pi * (hue[:, None] + phase[None, :]))
        rgb = np.where(light[:, None], 180.0, 70.0) + 60.0 * rgb
        row = np.repeat(rgb.astype(np.uint8), _CELL, axis=0)[:width]  # (width, 3)
        ink = np.where(np.repeat(light, _CELL)[:width], 16, 250).astype(np.uint8)
        r0, r1 = max(y0, cy * _CELL), min(y1, (cy + 1) * _CELL)
        for c in range(3):
            out[r0 - y0 : r1 - y0, :, c] = row[:, c]
        for y in range(r0, r1):
            o = out[y - y0]
            on = _label_row(y % _CELL, width, _CELL, 4, 8, y // _CELL, cell_digits)
            big = _label_row(y % _BLOCK, width, _BLOCK, 16, 48, y // _BLOCK, block_digits)
            for c in range(3):
                o[on, c] = ink[on]
                o[big, c] = 0
    # Grid: 1 texel every cell, 4 red texels every block.
    xs = np.arange(width)
    ys = np.arange(y0, y1)
    out[(ys % _CELL) == 0, :, :3] = 20
    out[:, (xs % _CELL) == 0, :3] = 20
    thick_rows, thick_cols = (ys % _BLOCK) < 4, (xs % _BLOCK) < 4
    out[thick_rows, :, :3] = (230, 40, 40)
    out[:, thick_cols, :3] = (230, 40, 40)
    return out


_GENERATORS = {"terrain": terrain_rows, "normals": normal_rows, "checker": checker_rows}


@dataclass(frozen=True)
class ProceduralSource:
    """A `Source` that computes its rows: cheap to pickle, random access, deterministic by seed."""

    pattern: str
    width: int
    height: int
    seed: int = 1

    parallel = True  # workers may generate their own bands

    def __post_init__(self) -> None:
        if self.pattern not in _GENERATORS:
            raise ValueError(f"unknown pattern {self.pattern!r} (choose from {', '.join(PATTERNS)})")
        for name in ("width", "height"):
            v = getattr(self, name)
            if not isinstance(v, int) or not 1 <= v <= MAX_DIMENSION:
                raise ValueError(f"{name} must be an integer in 1..{MAX_DIMENSION}, got {v!r}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be an integer in 0..2^32-1, got {self.seed!r}")

    @property
    def name(self) -> str:
        return f"{self.pattern}-{self.width}x{self.height}-s{self.seed}"

    @property
    def channels(self) -> int:
        return 3

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        if not 0 <= y0 < y1 <= self.height:
            raise ValueError(f"row range {y0}..{y1} is outside 0..{self.height} of {self.name}")
        gen = _GENERATORS[self.pattern]
        out = np.empty((y1 - y0, self.width, 4), np.uint8)
        step = max(1, _STRIP_TEXELS // self.width)
        try:
            for y in range(y0, y1, step):
                z = min(y1, y + step)
                gen(y, z, self.width, self.height, self.seed, out=out[y - y0 : z - y0])
        except MemoryError:
            raise SourceError(f"out of memory generating {self.name} rows {y0}..{y1}") from None
        return out

    def describe(self) -> dict:
        return {"source_kind": "procedural", "pattern": self.pattern, "seed": self.seed}


__all__ = [
    "PATTERNS",
    "ProceduralSource",
    "checker_rows",
    "fbm",
    "fbm_lattice",
    "lattice_noise",
    "normal_rows",
    "terrain_rows",
    "use_generator_loops",
]
