"""Page tables of every open virtual texture: for each page, the cache slot of its own tile.

A page (texture, level, x, y) is a tile of the pack (one tile id, `tiles.TileSpace`). Its entry names
the cache slot holding that tile, or says that the tile is not resident. A page whose tile is missing
is drawn from its nearest resident ancestor: the shader (``vt_lookup`` in shaders/vt.glsl) walks up
the levels until it finds a resident entry, and `resident_level` / `sample_slot` answer the same
walk on the CPU. Nothing is propagated to finer levels, so arrivals and evictions are plain fancy
indexing over the batch: no per-level rewrite of the pages under a tile. The walk is one lookup for
every resident page (nearly all of them once a view has converged) and a few for the pages still
loading; the coarsest levels are pinned, so it always ends on a resident tile.

Entries (uint32, the same bits on the CPU and in the GPU buffer the shader reads)::

    bits 31..28  the tile's level
    bits 27..0   slot index in the texture's cache pool (cell = slot // layers, layer = slot % layers)
    0xFFFFFFFF   not resident

The entries live in one array over the whole tile id space, uploaded into ONE shader storage buffer
shared by every texture (binding ``VT_PAGES_BINDING``). The ``HEADER`` entries at the start of each
texture's id range hold each level's first tile id, so the shader finds page (level, x, y) at
``pages[pages[base + level] + y * tiles_x + x]``. Changed entries are uploaded as a few id ranges
per frame (`take_dirty`): changes are tracked in blocks of ``DIRTY_BLOCK`` entries, so marking a batch
is one store per id and taking the ranges one pass over the blocks, with no sort of the ids.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from .int_sets import has_duplicates
from .tiles import MAX_LEVELS, MAX_TEXTURES, TileSpace

__all__ = ["ENTRY_NONE", "LEVEL_SHIFT", "NO_LEVEL", "NO_SLOT", "PageTables", "TexturePages"]

log = logging.getLogger(__name__)

ENTRY_NONE = np.uint32(0xFFFFFFFF)
LEVEL_SHIFT = 28
SLOT_MASK = (1 << LEVEL_SHIFT) - 1
MAX_SLOT = SLOT_MASK - 1
NO_LEVEL = 255  # resident level of a page with nothing resident (CPU answers)
NO_SLOT = -1
DIRTY_SHIFT = 9
DIRTY_BLOCK = 1 << DIRTY_SHIFT  # entries tracked dirty together (2 KiB): a range goes out whole
ENTRY_BYTES = 4


class PageTables:
    """Entries of every page of every texture, updated incrementally in batches. Render thread only.

    Parameters
    ----------
    space
        The tile id space (its listeners grow these arrays with it).
    """

    def __init__(self, space: TileSpace) -> None:
        self.space = space
        self.own = np.full(space.capacity, NO_SLOT, np.int32)  # a tile's own slot while resident
        self.entry = np.full(space.capacity, ENTRY_NONE, np.uint32)  # what the page samples (GPU bits)
        self.first_pinned = np.zeros(MAX_TEXTURES, np.int64)  # first pinned level per texture
        self.resident_count = np.zeros(MAX_TEXTURES, np.int64)
        self._dirty = np.zeros(self._blocks(space.capacity), bool)  # per DIRTY_BLOCK entries: changed
        self.version = 0  # advances with every change of an entry (answers derived from them can be kept)
        space.add_listener(self._grow)

    def _grow(self, capacity: int) -> None:
        extra = capacity - self.own.size
        self.own = np.concatenate([self.own, np.full(extra, NO_SLOT, np.int32)])
        self.entry = np.concatenate([self.entry, np.full(extra, ENTRY_NONE, np.uint32)])
        grown = self._blocks(capacity) - self._dirty.size
        if grown > 0:
            self._dirty = np.concatenate([self._dirty, np.zeros(grown, bool)])

    @staticmethod
    def _blocks(capacity: int) -> int:
        return -(-capacity // DIRTY_BLOCK)

    # ---- textures ------------------------------------------------------------------------------
    def add_texture(self, tex: int, pinned_levels: int) -> None:
        """Start a texture's table: nothing resident, its header entries written."""
        if pinned_levels < 1:
            raise ValueError(f"pinned_levels must be >= 1 (the coarsest level), got {pinned_levels!r}")
        rng = self.space.ranges[tex]
        levels = int(self.space.level_count[tex])
        self.own[rng.start : rng.stop] = NO_SLOT
        self.entry[rng.start : rng.stop] = ENTRY_NONE
        self.entry[rng.start : rng.start + levels] = self.space.level_first[tex, :levels].astype(np.uint32)
        self.first_pinned[tex] = max(0, levels - pinned_levels)
        self.resident_count[tex] = 0
        self._mark_range(rng.start, rng.stop)

    def remove_texture(self, tex: int) -> None:
        rng = self.space.ranges[tex]
        self.own[rng.start : rng.stop] = NO_SLOT
        self.entry[rng.start : rng.stop] = ENTRY_NONE
        self.resident_count[tex] = 0
        self._mark_range(rng.start, rng.stop)

    # ---- lookups (vectorized) ------------------------------------------------------------------
    def nearest_resident(self, ids: np.ndarray) -> np.ndarray:
        """Each page's own tile when resident, else its nearest resident ancestor; -1 when none is
        (only before a texture's pinned levels are loaded). One pass per level walked."""
        shape = np.shape(ids)
        cur = np.asarray(ids, np.int64).ravel().copy()
        look = (self.own[cur] < 0).nonzero()[0]
        for _ in range(MAX_LEVELS):
            if look.size == 0:
                break
            up = self.space.parent[cur[look]].astype(np.int64)
            cur[look] = up
            top = up < 0
            look = look[~top]
            look = look[self.own[cur[look]] < 0]
        cur[self.own[np.maximum(cur, 0)] < 0] = -1
        return cur.reshape(shape)

    def resident_level(self, ids: np.ndarray) -> np.ndarray:
        """Level each page samples (its own or an ancestor's); NO_LEVEL when none (int64)."""
        tile = self.nearest_resident(ids)
        return np.where(tile >= 0, self.space.level[np.maximum(tile, 0)].astype(np.int64), NO_LEVEL)

    def sample_slot(self, ids: np.ndarray) -> np.ndarray:
        """Slot each page samples (its own or an ancestor's); NO_SLOT when none (int64)."""
        tile = self.nearest_resident(ids)
        return np.where(tile >= 0, self.own[np.maximum(tile, 0)], NO_SLOT).astype(np.int64)

    def is_resident(self, ids: np.ndarray) -> np.ndarray:
        return self.own[ids] >= 0

    # ---- updates -------------------------------------------------------------------------------
    def set_resident(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Tiles `ids` now sit in `slots` (arrivals, or moves)."""
        ids = np.asarray(ids, np.int64).ravel()
        slots = np.asarray(slots, np.int64).ravel()
        if ids.size != slots.size:
            raise ValueError(f"{ids.size} tiles but {slots.size} slots")
        if ids.size == 0:
            return
        self._check_tiles(ids)
        if slots.min() < 0 or slots.max() > MAX_SLOT:
            raise ValueError(f"slots must be in 0..{MAX_SLOT}, got {slots.min()}..{slots.max()}")
        if has_duplicates(ids):
            raise ValueError("a tile is listed twice in one set_resident call")
        new = self.own[ids] < 0
        np.add.at(self.resident_count, self.space.tex[ids[new]].astype(np.int64), 1)
        self.own[ids] = slots
        self.entry[ids] = (self.space.level[ids].astype(np.uint32) << np.uint32(LEVEL_SHIFT)) | slots.astype(np.uint32)
        self._mark_ids(ids)

    def set_absent(self, ids: np.ndarray) -> None:
        """Tiles `ids` left their slots (evictions): their pages fall back to the nearest resident
        ancestor. ValueError for a tile that is not resident or belongs to a pinned level."""
        ids = np.asarray(ids, np.int64).ravel()
        if ids.size == 0:
            return
        self._check_tiles(ids)
        if has_duplicates(ids):
            raise ValueError("a tile is listed twice in one set_absent call")
        if np.any(self.own[ids] < 0):
            bad = int(ids[self.own[ids] < 0][0])
            raise ValueError(f"tile {self._name(bad)} is not resident")
        tex = self.space.tex[ids].astype(np.int64)
        pinned = self.space.level[ids] >= self.first_pinned[tex]
        if pinned.any():
            raise ValueError(f"tile {self._name(int(ids[pinned][0]))} is on a pinned level")
        np.subtract.at(self.resident_count, tex, 1)
        self.own[ids] = NO_SLOT
        self.entry[ids] = ENTRY_NONE
        self._mark_ids(ids)

    def move_slots(self, textures: list[int], old_slots: np.ndarray, new_slots: np.ndarray) -> None:
        """Rename slots after a pool resize, in the tables of the pool's `textures`."""
        old = np.asarray(old_slots, np.int64).ravel()
        new = np.asarray(new_slots, np.int64).ravel()
        if old.shape != new.shape:
            raise ValueError(f"old and new slot lists differ in length: {old.size} vs {new.size}")
        if old.size == 0:
            return
        remap = np.arange(int(max(old.max(), new.max())) + 1, dtype=np.int64)
        remap[old] = new
        for tex in textures:
            rng = self.space.ranges[tex]
            sl = slice(rng.first_tile, rng.stop)
            own = self.own[sl]
            hit = ((own >= 0) & (own < remap.size)).nonzero()[0]
            own[hit] = remap[own[hit]]
            e = self.entry[sl]
            e[hit] = (e[hit] & ~np.uint32(SLOT_MASK)) | own[hit].astype(np.uint32)
            if hit.size:
                self._mark_ids(rng.first_tile + hit)

    def _check_tiles(self, ids: np.ndarray) -> None:
        ok = self.space.is_tile(ids)
        if not ok.all():
            raise ValueError(f"id {int(ids[~ok][0])} names no tile of an open texture")

    def _name(self, tile: int) -> str:
        t, lv, x, y = (int(v[0]) for v in self.space.coords(np.array([tile])))
        return f"(texture {t}, level {lv}, {x}, {y})"

    # ---- dirty ranges --------------------------------------------------------------------------
    def _mark_ids(self, ids: np.ndarray) -> None:
        """Entries `ids` (int64, in the space) changed."""
        self.version += 1
        self._dirty[ids >> DIRTY_SHIFT] = True

    def _mark_range(self, lo: int, hi: int) -> None:
        """Entries lo..hi-1 changed."""
        self.version += 1
        if hi > lo:
            self._dirty[lo >> DIRTY_SHIFT : ((hi - 1) >> DIRTY_SHIFT) + 1] = True

    def take_dirty(self) -> list[tuple[int, int]]:
        """Id ranges ``[lo, hi)`` covering every entry changed since the last call (upload these
        entries), ascending and disjoint: whole blocks of `DIRTY_BLOCK` entries, consecutive blocks
        as one range, clipped to the ids in use."""
        blocks = np.flatnonzero(self._dirty)
        if blocks.size == 0:
            return []
        self._dirty[blocks] = False
        runs: list[list[int]] = []
        for b in blocks.tolist():  # a frame's arrivals touch few blocks
            if runs and runs[-1][1] == b:
                runs[-1][1] = b + 1
            else:
                runs.append([b, b + 1])
        used = self.space.used
        return [(lo << DIRTY_SHIFT, min(hi << DIRTY_SHIFT, used)) for lo, hi in runs if lo << DIRTY_SHIFT < used]

    def mark_all_dirty(self) -> None:
        self._mark_range(0, self.space.used)

    # ---- checks --------------------------------------------------------------------------------
    def validate(self, tex: int) -> None:
        """Assert texture `tex`'s entries agree with its tiles' slots (tests and debugging)."""
        ids = self.space.tile_ids(tex)
        own = self.own[ids]
        expect = np.where(
            own >= 0,
            (self.space.level[ids].astype(np.uint32) << np.uint32(LEVEL_SHIFT)) | np.maximum(own, 0).astype(np.uint32),
            ENTRY_NONE,
        )
        assert np.array_equal(self.entry[ids], expect), "page-table entries differ from the tiles' slots"
        assert int(np.count_nonzero(own >= 0)) == int(self.resident_count[tex])
        levels = int(self.space.level_count[tex])
        start = self.space.ranges[tex].start
        assert np.array_equal(self.entry[start : start + levels], self.space.level_first[tex, :levels])


@dataclass(frozen=True)
class TexturePages:
    """One texture's view of the shared page tables, addressed by (level, x, y) (tools, tests)."""

    tables: PageTables
    tex: int

    @property
    def _space(self) -> TileSpace:
        return self.tables.space

    @property
    def level_count(self) -> int:
        return int(self._space.level_count[self.tex])

    @property
    def top_level(self) -> int:
        return self.level_count - 1

    @property
    def first_pinned_level(self) -> int:
        return int(self.tables.first_pinned[self.tex])

    @property
    def tiles_x(self) -> np.ndarray:
        return self._space.tiles_x[self.tex, : self.level_count]

    @property
    def tiles_y(self) -> np.ndarray:
        return self._space.tiles_y[self.tex, : self.level_count]

    @property
    def resident_count(self) -> int:
        return int(self.tables.resident_count[self.tex])

    @property
    def bytes_on_gpu(self) -> int:
        """Bytes of this texture's entries in the shared page-table buffer."""
        rng = self._space.ranges[self.tex]
        return (rng.stop - rng.start) * ENTRY_BYTES

    def ids(self, level: np.ndarray | int, x: np.ndarray | int, y: np.ndarray | int) -> np.ndarray:
        return self._space.ids(self.tex, level, x, y)

    def flat_index(self, level: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Position of each page in the pack index (ValueError when outside the texture)."""
        return self._space.pack_index(self.ids(level, x, y))

    def is_resident(self, level: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return self.tables.is_resident(self.ids(level, x, y))

    def resident_levels(self, level: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Level each page samples (its own or an ancestor's); NO_LEVEL (255) when none."""
        return self.tables.resident_level(self.ids(level, x, y))

    def slots_at(self, level: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Slot each page samples; NO_SLOT (-1) when none."""
        return self.tables.sample_slot(self.ids(level, x, y))

    def resident_tiles(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(level, x, y, slot) of every resident tile."""
        rng = self._space.ranges[self.tex]
        ids = rng.first_tile + (self.tables.own[rng.first_tile : rng.stop] >= 0).nonzero()[0]
        _, lv, x, y = self._space.coords(ids)
        return lv, x, y, self.tables.own[ids].astype(np.int64)

    def validate(self) -> None:
        self.tables.validate(self.tex)
