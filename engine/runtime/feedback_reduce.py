"""Feedback reduction: the raw page ids the GPU wrote become unique wanted pages with coverage.

Packing contract (shader and CPU must agree; one uint32 per feedback entry)::

    bits 31..24  texture id   0..254   (255 is reserved: 0xFFFFFFFF means "empty")
    bits 23..20  level        0..15
    bits 19..10  page y       0..1023
    bits  9..0   page x       0..1023
    0xFFFFFFFF   empty entry (the clear value: no virtual-texture sample here)

This covers 1024 pages a side at level 0: 65536 texels with T=64, 131072 with T=128, 262144 with
T=256 (`check_packable` refuses larger textures), up to 11 levels of such a texture, and 255
textures. GLSL side (``shaders/``; the lead writes it identically)::

    const uint VT_FEEDBACK_EMPTY = 0xFFFFFFFFu;
    uint vt_pack_feedback(uint tex_id, uint level, uvec2 page) {
        // level: clamp(floor(lod), 0, level_count - 1); page: clamp(floor(uv * size / (T << level)),
        // 0, tiles_in_level - 1), so every id written is in range
        return (tex_id << 24) | ((level & 0xFu) << 20) | ((page.y & 0x3FFu) << 10) | (page.x & 0x3FFu);
    }

The buffer may be an R32UI image cleared to VT_FEEDBACK_EMPTY (one entry per feedback texel) or an
SSBO of appended entries (pass only the first `count`); either way it is read back as uint32
(little-endian, native to every GL platform) and handed to `FeedbackReducer.reduce`, which drops
empty entries, counts and drops invalid ones (unknown texture, level or page out of range), counts
each unique page (its coverage: how many feedback texels wanted it) and applies the mip bias.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..pack.format import PackHeader
from .tile_cache import tile_keys

__all__ = [
    "FEEDBACK_EMPTY",
    "FeedbackReducer",
    "FeedbackResult",
    "WantedPages",
    "check_packable",
    "pack_feedback",
    "unpack_feedback",
]

log = logging.getLogger(__name__)

FEEDBACK_EMPTY = 0xFFFFFFFF
TEX_SHIFT, LEVEL_SHIFT, Y_SHIFT = 24, 20, 10
MAX_TEX = 254
MAX_LEVEL = 15
MAX_PAGE = 1023


@dataclass(frozen=True)
class WantedPages:
    """Unique pages wanted this frame with their coverage counts (parallel int64 arrays)."""

    tex: np.ndarray
    level: np.ndarray
    x: np.ndarray
    y: np.ndarray
    count: np.ndarray

    def __post_init__(self) -> None:
        arrays = [np.asarray(getattr(self, f), np.int64).ravel() for f in ("tex", "level", "x", "y", "count")]
        if len({a.shape[0] for a in arrays}) != 1:
            raise ValueError(f"wanted-page arrays differ in length: {[a.shape[0] for a in arrays]}")
        for f, a in zip(("tex", "level", "x", "y", "count"), arrays, strict=True):
            object.__setattr__(self, f, a)

    @classmethod
    def empty(cls) -> WantedPages:
        z = np.zeros(0, np.int64)
        return cls(z, z, z, z, z)

    @classmethod
    def from_tiles(cls, tiles: list[tuple[int, int, int, int, int]]) -> WantedPages:
        """From (tex, level, x, y, count) tuples; handy in tests and tools."""
        if not tiles:
            return cls.empty()
        a = np.asarray(tiles, np.int64).reshape(-1, 5)
        return cls(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4])

    def __len__(self) -> int:
        return int(self.tex.shape[0])

    def keys(self) -> np.ndarray:
        return tile_keys(self.tex, self.level, self.x, self.y)

    @property
    def coverage(self) -> int:
        return int(self.count.sum())


@dataclass(frozen=True)
class FeedbackResult:
    """One reduced feedback buffer."""

    pages: WantedPages
    samples: int  # entries in the buffer
    empty: int  # entries equal to FEEDBACK_EMPTY
    invalid: int  # entries naming no page of a registered texture (dropped)
    bias_levels: int  # whole levels the pages were coarsened by


def pack_feedback(
    tex: np.ndarray | int, level: np.ndarray | int, x: np.ndarray | int, y: np.ndarray | int
) -> np.ndarray:
    """CPU twin of vt_pack_feedback (tests, CPU rendering paths); ValueError when a field overflows."""
    t, lv, xx, yy = (np.asarray(a, np.int64) for a in (tex, level, x, y))
    for name, arr, hi in (
        ("texture id", t, MAX_TEX),
        ("level", lv, MAX_LEVEL),
        ("x", xx, MAX_PAGE),
        ("y", yy, MAX_PAGE),
    ):
        if arr.size and (arr.min() < 0 or arr.max() > hi):
            raise ValueError(f"feedback {name} out of range 0..{hi}: min {arr.min()}, max {arr.max()}")
    return ((t << TEX_SHIFT) | (lv << LEVEL_SHIFT) | (yy << Y_SHIFT) | xx).astype(np.uint32)


def unpack_feedback(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tex, level, x, y) int64 arrays of packed feedback ids."""
    v = np.asarray(ids).astype(np.int64)
    return v >> TEX_SHIFT, (v >> LEVEL_SHIFT) & MAX_LEVEL, v & MAX_PAGE, (v >> Y_SHIFT) & MAX_PAGE


def check_packable(header: PackHeader) -> None:
    """ValueError when a texture's pages or levels do not fit the feedback packing."""
    tx, ty = header.tiles_in_level(0)
    if max(tx, ty) > MAX_PAGE + 1 or header.level_count > MAX_LEVEL + 1:
        raise ValueError(
            f"a {header.width}x{header.height} texture with {header.tile_size}-texel tiles has {tx}x{ty} "
            f"pages at level 0; feedback ids hold at most {MAX_PAGE + 1} a side"
        )


class FeedbackReducer:
    """Reduces raw feedback buffers against the registered textures' page grids (vectorized)."""

    def __init__(self, textures: Mapping[int, PackHeader] | None = None) -> None:
        self._levels = np.zeros(MAX_TEX + 2, np.int64)  # 0: not registered (every level invalid)
        self._tiles_x = np.zeros((MAX_TEX + 2, MAX_LEVEL + 1), np.int64)
        self._tiles_y = np.zeros((MAX_TEX + 2, MAX_LEVEL + 1), np.int64)
        for tex_id, header in (textures or {}).items():
            self.register(tex_id, header)

    def register(self, tex_id: int, header: PackHeader) -> None:
        if not 0 <= tex_id <= MAX_TEX:
            raise ValueError(f"texture id {tex_id!r} is outside 0..{MAX_TEX}")
        check_packable(header)
        table = header.level_table
        n = header.level_count
        self._levels[tex_id] = n
        self._tiles_x[tex_id] = 0
        self._tiles_y[tex_id] = 0
        self._tiles_x[tex_id, :n] = table["tiles_x"]
        self._tiles_y[tex_id, :n] = table["tiles_y"]

    def unregister(self, tex_id: int) -> None:
        if 0 <= tex_id <= MAX_TEX:
            self._levels[tex_id] = 0
            self._tiles_x[tex_id] = 0
            self._tiles_y[tex_id] = 0

    def reduce(self, raw: np.ndarray, bias: float = 0.0) -> FeedbackResult:
        """Unique wanted pages with coverage counts, coarsened by floor(bias) levels.

        Args:
            raw: the read-back buffer, any shape, uint32 packed ids (see the module docstring).
            bias: feedback mip bias in levels (>= 0); pages move floor(bias) levels coarser, clamped
                to each texture's coarsest level, and merge (their counts add up).
        """
        ids = np.asarray(raw)
        if ids.dtype != np.uint32:
            if not np.issubdtype(ids.dtype, np.integer):
                raise TypeError(f"feedback buffer must hold uint32 ids, got dtype {ids.dtype}")
            ids = ids.astype(np.uint32)
        if not (math.isfinite(bias) and bias >= 0):
            raise ValueError(f"mip bias must be a finite number >= 0, got {bias!r}")
        ids = ids.ravel()
        total = int(ids.size)
        ids = ids[ids != FEEDBACK_EMPTY]
        empty = total - int(ids.size)
        uniq, counts = np.unique(ids, return_counts=True)
        tex, level, x, y = unpack_feedback(uniq)
        counts = counts.astype(np.int64)
        tex_c = np.minimum(tex, MAX_TEX + 1)
        valid = (
            (level < self._levels[tex_c])
            & (x < self._tiles_x[tex_c, level])
            & (y < self._tiles_y[tex_c, level])
        )
        invalid = int(counts[~valid].sum())
        if invalid:
            log.debug("feedback: %d of %d entries name no page and were dropped", invalid, total)
        tex, level, x, y, counts = tex[valid], level[valid], x[valid], y[valid], counts[valid]
        b = math.floor(bias)
        if b and tex.size:
            coarse = np.minimum(level + b, self._levels[tex] - 1)
            shift = coarse - level
            level, x, y = coarse, x >> shift, y >> shift
            keys = tile_keys(tex, level, x, y)
            ukeys, inv = np.unique(keys, return_inverse=True)
            counts = np.bincount(inv.ravel(), weights=counts, minlength=ukeys.size).astype(np.int64)
            first = np.zeros(ukeys.size, np.int64)
            first[inv.ravel()] = np.arange(keys.size)
            tex, level, x, y = tex[first], level[first], x[first], y[first]
        pages = WantedPages(tex, level, x, y, counts)
        return FeedbackResult(pages=pages, samples=total, empty=empty, invalid=invalid, bias_levels=b)
