"""The tile id space: every tile of every open virtual texture has one integer id.

Per-tile state of the runtime (page-table entries, request state, in-flight loads) lives in dense
arrays indexed by these ids, so per-frame work is fancy indexing over all textures at once instead
of lookups keyed by (texture, level, x, y).

Layout: each open texture owns one contiguous range ``[start, start + HEADER + tile_count)``. The
first `HEADER` entries of a range are not tiles: in the page-table buffer they hold, for each
level, the id of that level's first tile (what ``vt_lookup`` in shaders/vt.glsl reads). Tile
``(level, x, y)`` of a texture has id ``level_first[level] + y * tiles_x[level] + x``, which is
``start + HEADER + i`` for ``i`` the tile's position in its pack's index, so an id also indexes the
pack index directly. Ranges of closed textures are reused first-fit; the space grows (amortized
doubling) when no gap fits, and `add_listener` callbacks resize the arrays other owners keep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..pack.format import PackHeader

__all__ = ["HEADER", "MAX_LEVELS", "MAX_TEXTURES", "TileRange", "TileSpace"]

log = logging.getLogger(__name__)

HEADER = 16  # entries before a texture's first tile: one per level (level-first ids for the shader)
MAX_LEVELS = 16  # level field of a page-table entry (4 bits)
MAX_TEXTURES = 256  # texture ids 0..255
MAX_IDS = 1 << 31  # ids are stored as int32 in per-tile arrays and as uint32 on the GPU


@dataclass(frozen=True)
class TileRange:
    """The ids of one texture: `start` .. `stop` (exclusive), tiles from `first_tile`."""

    tex: int
    start: int
    stop: int

    @property
    def first_tile(self) -> int:
        return self.start + HEADER

    @property
    def tile_count(self) -> int:
        return self.stop - self.first_tile


class TileSpace:
    """Allocates id ranges to textures and answers vectorized questions about ids.

    Per id it keeps the texture (``tex``, -1 for header and unused entries), the level (``level``)
    and the parent id (``parent``, -1 for the coarsest level). Per texture and level it keeps the
    first id and the tile grid (``level_first``, ``tiles_x``, ``tiles_y``, indexed ``[tex, level]``).
    Render thread only; the arrays are public for reading, changed only through this class.
    """

    def __init__(self, capacity: int = 1 << 12) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        self.capacity = int(capacity)
        self.tex = np.full(self.capacity, -1, np.int16)
        self.level = np.full(self.capacity, -1, np.int8)
        self.parent = np.full(self.capacity, -1, np.int32)
        self.level_first = np.zeros((MAX_TEXTURES, MAX_LEVELS), np.int64)
        self.tiles_x = np.zeros((MAX_TEXTURES, MAX_LEVELS), np.int64)
        self.tiles_y = np.zeros((MAX_TEXTURES, MAX_LEVELS), np.int64)
        self.level_count = np.zeros(MAX_TEXTURES, np.int64)  # 0: no texture with this id
        self.tile_bytes = np.zeros(MAX_TEXTURES, np.int64)
        self.ranges: dict[int, TileRange] = {}
        self._listeners: list[Callable[[int], None]] = []
        self.generation = 0  # counts registrations and unregistrations: which ids name tiles changed

    # ---- registration ---------------------------------------------------------------------------
    def add_listener(self, on_grow: Callable[[int], None]) -> None:
        """Call `on_grow(new_capacity)` whenever the space grows (resize your per-id arrays)."""
        self._listeners.append(on_grow)

    def register(self, tex: int, header: PackHeader) -> TileRange:
        """Give texture `tex` a range of ids for `header`'s tiles (ValueError if it has one)."""
        if not 0 <= tex < MAX_TEXTURES:
            raise ValueError(f"texture id {tex!r} is outside 0..{MAX_TEXTURES - 1}")
        if tex in self.ranges:
            raise ValueError(f"texture id {tex} already has tile ids")
        levels = header.level_count
        if levels > MAX_LEVELS:
            raise ValueError(f"{levels} levels; page-table entries hold at most {MAX_LEVELS}")
        size = HEADER + header.tile_count
        start = self._find_gap(size)
        if start + size > MAX_IDS:
            raise ValueError(f"{header.tile_count} more tiles do not fit {MAX_IDS} tile ids")
        if start + size > self.capacity:
            self._grow(start + size)
        rng = TileRange(tex, start, start + size)
        table = header.level_table
        tx, ty = table["tiles_x"].astype(np.int64), table["tiles_y"].astype(np.int64)
        first = rng.first_tile + header.level_first[:levels].astype(np.int64)
        self.level_first[tex] = 0
        self.tiles_x[tex] = 0
        self.tiles_y[tex] = 0
        self.level_first[tex, :levels] = first
        self.tiles_x[tex, :levels] = tx
        self.tiles_y[tex, :levels] = ty
        self.level_count[tex] = levels
        self.tile_bytes[tex] = header.tile_raw_size
        ids = np.arange(rng.first_tile, rng.stop, dtype=np.int64)
        lv = np.repeat(np.arange(levels, dtype=np.int64), (tx * ty))
        off = ids - first[lv]
        x, y = off % tx[lv], off // tx[lv]
        up = lv + 1 < levels
        parent = np.full(ids.size, -1, np.int64)
        lu = lv[up] + 1
        parent[up] = first[lu] + (y[up] >> 1) * tx[lu] + (x[up] >> 1)
        self.tex[rng.start : rng.stop] = tex
        self.tex[rng.start : rng.first_tile] = -1  # header entries are not tiles
        self.level[rng.first_tile : rng.stop] = lv
        self.parent[rng.first_tile : rng.stop] = parent
        self.ranges[tex] = rng
        self.generation += 1
        log.debug("texture %d: tile ids %d..%d", tex, rng.start, rng.stop)
        return rng

    def unregister(self, tex: int) -> TileRange | None:
        """Free texture `tex`'s range (a later `register` may reuse it)."""
        rng = self.ranges.pop(tex, None)
        if rng is None:
            return None
        self.tex[rng.start : rng.stop] = -1
        self.level[rng.start : rng.stop] = -1
        self.parent[rng.start : rng.stop] = -1
        self.level_count[tex] = 0
        self.tile_bytes[tex] = 0
        self.generation += 1
        return rng

    def _find_gap(self, size: int) -> int:
        at = 0
        for rng in sorted(self.ranges.values(), key=lambda r: r.start):
            if rng.start - at >= size:
                return at
            at = rng.stop
        return at

    def _grow(self, need: int) -> None:
        new = max(need, min(MAX_IDS, 2 * self.capacity))
        extra = new - self.capacity
        self.tex = np.concatenate([self.tex, np.full(extra, -1, np.int16)])
        self.level = np.concatenate([self.level, np.full(extra, -1, np.int8)])
        self.parent = np.concatenate([self.parent, np.full(extra, -1, np.int32)])
        self.capacity = new
        log.debug("tile id space grown to %d ids", new)
        for on_grow in self._listeners:
            on_grow(new)

    @property
    def used(self) -> int:
        """One past the highest id in use (what a buffer mirroring the space must hold)."""
        return max((r.stop for r in self.ranges.values()), default=0)

    # ---- questions (vectorized) -----------------------------------------------------------------
    def ids(
        self, tex: np.ndarray | int, level: np.ndarray | int, x: np.ndarray | int, y: np.ndarray | int
    ) -> np.ndarray:
        """Ids of tiles given as (texture, level, x, y); ValueError for a tile that does not exist."""
        t, lv, xx, yy = np.broadcast_arrays(*(np.asarray(a, np.int64) for a in (tex, level, x, y)))
        ok = self.contains(t, lv, xx, yy)
        if not np.all(ok):
            i = int(np.flatnonzero(~np.ravel(ok))[0])
            bad = tuple(int(np.ravel(a)[i]) for a in (t, lv, xx, yy))
            raise ValueError(f"tile (texture, level, x, y) = {bad} does not exist")
        return self.level_first[t, lv] + yy * self.tiles_x[t, lv] + xx

    def contains(self, tex: np.ndarray, level: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Mask of the (texture, level, x, y) that name a tile of an open texture."""
        t = np.clip(tex, 0, MAX_TEXTURES - 1)
        lv = np.clip(level, 0, MAX_LEVELS - 1)
        return (
            (tex >= 0)
            & (tex < MAX_TEXTURES)
            & (level >= 0)
            & (level < self.level_count[t])
            & (x >= 0)
            & (y >= 0)
            & (x < self.tiles_x[t, lv])
            & (y < self.tiles_y[t, lv])
        )

    def is_tile(self, ids: np.ndarray) -> np.ndarray:
        """Mask of the ids that name a tile of an open texture (e.g. to validate GPU feedback)."""
        i = np.asarray(ids, np.int64)
        if i.size and int(i.min()) >= 0 and int(i.max()) < self.capacity:  # the usual case: one gather
            return self.level[i] >= 0
        inside = (i >= 0) & (i < self.capacity)
        out = np.zeros(i.shape, bool)
        out[inside] = self.level[i[inside]] >= 0
        return out

    def coords(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(texture, level, x, y) of tile ids, as int64 arrays."""
        i = np.asarray(ids, np.int64)
        t = self.tex[i].astype(np.int64)
        lv = self.level[i].astype(np.int64)
        off = i - self.level_first[t, lv]
        tx = self.tiles_x[t, lv]
        return t, lv, off % tx, off // tx

    def pack_index(self, ids: np.ndarray) -> np.ndarray:
        """Position of each tile in its pack's index."""
        i = np.asarray(ids, np.int64)
        return i - self.level_first[self.tex[i].astype(np.int64), 0]

    def ancestors(self, ids: np.ndarray, levels: int) -> np.ndarray:
        """Each tile's ancestor `levels` levels up (clamped at the coarsest level)."""
        out = np.asarray(ids, np.int64)
        for _ in range(levels):
            up = self.parent[out].astype(np.int64)
            out = np.where(up >= 0, up, out)
        return out

    def tile_ids(self, tex: int, levels: range | None = None) -> np.ndarray:
        """Every tile id of texture `tex` (optionally of some levels), coarsest level first."""
        n = int(self.level_count[tex])
        if n == 0:
            raise ValueError(f"texture id {tex} is not registered")
        parts = []
        for lv in range(n - 1, -1, -1):
            if levels is not None and lv not in levels:
                continue
            first = int(self.level_first[tex, lv])
            parts.append(np.arange(first, first + int(self.tiles_x[tex, lv] * self.tiles_y[tex, lv]), dtype=np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)
