"""Page tables: for every page of every level of a virtual texture, the slot it samples.

A page (level l, x, y) is the tile of the pack at that position. Its entry names the cache slot to
sample and the level actually resident there: the page's own tile when resident, otherwise its
nearest resident ancestor (level l + d, x >> d, y >> d). A tile at level l covers the
``2^(l-k) x 2^(l-k)`` pages of a finer level k under it (clipped at the level's edge), so a tile's
arrival or eviction rewrites only that sub-rectangle of each finer level, vectorized per level.

Once the coarsest tile is resident (it is pinned, with the rest of the `pinned_levels`), every page
of every level maps to some resident tile; that invariant is asserted on every eviction.

GPU representation: one RGBA16UI texture per virtual texture whose mip chain holds the levels.
GL's chain uses floor halving while the page grid uses ceil halving, so level 0 of the GL texture is
padded to a power of two a side (`gpu_texture_size`); GL level l is then at least as large as page
level l, and the two chains have the same length. Page level l lives at the origin of GL level l
(padding texels are never fetched). Texel (x, y) of level l is ``as_texture_data(l)[y, x]``:

    R = texture-array layer of the slot   (0xFFFF: nothing resident yet)
    G = level resident in that slot        (0xFFFF: nothing resident yet)
    B = cell x of the slot inside its layer (texel origin B * slot_size)
    A = cell y of the slot inside its layer

In the shader, for virtual-texture coordinate ``uv`` (normalized to level 0's W x H texels) and
wanted level ``l``::

    uvec4 e = texelFetch(page_table, ivec2(floor(uv * vec2(W, H) / float(T << l))), l);
    // e.r == 0xFFFF only before the coarsest tile has arrived
    vec2 f = fract(uv * vec2(W, H) / float(T << e.g));        // position inside the resident tile
    vec2 texel = vec2(e.ba) * float(S) + float(B) + f * float(T);
    // sample layer e.r of the pool's array at texel / layer_size

Alternatively the levels can be stacked in one 2-D atlas (`atlas_size`, `atlas_level_rows`): level
l's page (x, y) is atlas texel (x, atlas_level_rows[l] + y); the texel data is the same.

Changes are tracked per block of pages (`dirty_block`), so only changed regions are re-uploaded.
"""

from __future__ import annotations

import logging

import numpy as np

from ..pack.format import PackHeader
from .tile_cache import SlotGeometry

__all__ = ["NO_LEVEL", "NO_SLOT", "PageTable", "GPU_NONE"]

log = logging.getLogger(__name__)

NO_LEVEL = 255  # resident level of a page with nothing resident above it (CPU arrays)
NO_SLOT = -1
GPU_NONE = 0xFFFF  # layer / level value in the GPU data for "nothing resident"
GPU_TEXEL_BYTES = 8  # RGBA16UI

Rect = tuple[int, int, int, int]  # x0, y0, x1, y1 (exclusive ends)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class PageTable:
    """CPU page table of one virtual texture, kept incrementally, plus its GPU texture data.

    Args:
        header: the texture's pack header (level geometry).
        pinned_levels: how many of the coarsest levels are pinned (never set absent).
        geometry: the slot layout of the texture's cache pool (layer / cell of each slot);
            default one slot per layer.
    """

    def __init__(
        self,
        header: PackHeader,
        pinned_levels: int,
        geometry: SlotGeometry | None = None,
        *,
        dirty_block: int = 16,
    ) -> None:
        if pinned_levels < 1:
            raise ValueError(f"pinned_levels must be >= 1 (the coarsest level), got {pinned_levels!r}")
        if dirty_block < 1:
            raise ValueError(f"dirty_block must be >= 1 page, got {dirty_block!r}")
        self.header = header
        self.level_count = header.level_count
        self.pinned_levels = min(pinned_levels, self.level_count)
        self.geometry = geometry or SlotGeometry(slot_size=header.slot_size, slot_bytes=header.tile_raw_size)
        table = header.level_table
        self.tiles_x = table["tiles_x"].astype(np.int64)
        self.tiles_y = table["tiles_y"].astype(np.int64)
        self.level_first = header.level_first.astype(np.int64)
        n = header.tile_count
        self._own = np.full(n, NO_SLOT, np.int32)  # the tile's own slot when resident
        self._slot = np.full(n, NO_SLOT, np.int32)  # slot each page samples (own or ancestor's)
        self._res = np.full(n, NO_LEVEL, np.uint8)  # level resident in that slot
        self._own_v = self._views(self._own)
        self._slot_v = self._views(self._slot)
        self._res_v = self._views(self._res)
        # Dirty tracking: one bit per dirty_block x dirty_block pages of each level.
        self.dirty_block = dirty_block
        self._dirty = [
            np.zeros((-(-int(self.tiles_y[k]) // dirty_block), -(-int(self.tiles_x[k]) // dirty_block)), bool)
            for k in range(self.level_count)
        ]
        self.resident_count = 0
        self.mark_all_dirty()

    def _views(self, flat: np.ndarray) -> list[np.ndarray]:
        return [
            flat[self.level_first[lv] : self.level_first[lv + 1]].reshape(
                int(self.tiles_y[lv]), int(self.tiles_x[lv])
            )
            for lv in range(self.level_count)
        ]

    # ---- geometry ------------------------------------------------------------------------------
    @property
    def top_level(self) -> int:
        return self.level_count - 1

    @property
    def first_pinned_level(self) -> int:
        return self.level_count - self.pinned_levels

    def contains(self, level: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Mask of the (level, x, y) triples that name a page of this texture (vectorized)."""
        lv = np.asarray(level, np.int64)
        xx, yy = np.asarray(x, np.int64), np.asarray(y, np.int64)
        ok = (lv >= 0) & (lv < self.level_count)
        lc = np.where(ok, lv, 0)
        return ok & (xx >= 0) & (yy >= 0) & (xx < self.tiles_x[lc]) & (yy < self.tiles_y[lc])

    def flat_index(self, level: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Index of each page in the flat arrays (the pack index order); ValueError if out of range."""
        lv = np.asarray(level, np.int64)
        xx, yy = np.asarray(x, np.int64), np.asarray(y, np.int64)
        ok = self.contains(lv, xx, yy)
        if not np.all(ok):
            i = int(np.flatnonzero(np.ravel(~ok))[0])
            bad = (np.ravel(np.broadcast_to(a, ok.shape))[i] for a in (lv, xx, yy))
            raise ValueError(f"page (level, x, y) = {tuple(int(v) for v in bad)} is outside the texture")
        return self.level_first[lv] + yy * self.tiles_x[lv] + xx

    def pinned_tiles(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(level, x, y) of every tile of the pinned levels, coarsest first: load these up front."""
        levels = range(self.top_level, self.first_pinned_level - 1, -1)
        parts = []
        for lv in levels:
            yy, xx = np.mgrid[0 : int(self.tiles_y[lv]), 0 : int(self.tiles_x[lv])]
            parts.append(
                (np.full(xx.size, lv, np.int64), xx.ravel().astype(np.int64), yy.ravel().astype(np.int64))
            )
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]

    # ---- lookups (vectorized) ------------------------------------------------------------------
    def lookup(self, level: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(valid, resident level) per page in one pass; invalid pages get NO_LEVEL, no error."""
        lv, xx, yy = np.broadcast_arrays(*(np.asarray(a, np.int64) for a in (level, x, y)))
        valid = self.contains(lv, xx, yy)
        res = np.full(valid.shape, NO_LEVEL, np.uint8)
        res[valid] = self._res[self.level_first[lv[valid]] + yy[valid] * self.tiles_x[lv[valid]] + xx[valid]]
        return valid, res

    def is_resident(self, level: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return self._own[self.flat_index(level, x, y)] >= 0

    def resident_levels(self, level: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Level each page samples (its own or an ancestor's); NO_LEVEL (255) when none."""
        return self._res[self.flat_index(level, x, y)]

    def slots_at(self, level: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Slot each page samples; NO_SLOT (-1) when none."""
        return self._slot[self.flat_index(level, x, y)]

    def used_slots(self, level: np.ndarray, x: np.ndarray, y: np.ndarray, coarser: int = 1) -> np.ndarray:
        """Unique slots sampled by these pages and by their next `coarser` ancestors (trilinear).

        Touch these in the pool each frame so nothing a visible page samples is evicted.
        """
        lv = np.asarray(level, np.int64)
        xx, yy = np.asarray(x, np.int64), np.asarray(y, np.int64)
        parts = [self.slots_at(lv, xx, yy)]
        for d in range(1, coarser + 1):
            keep = lv + d <= self.top_level
            parts.append(self.slots_at(lv[keep] + d, xx[keep] >> d, yy[keep] >> d))
        s = np.unique(np.concatenate(parts))
        return s[s >= 0]

    def own_slot(self, level: int, x: int, y: int) -> int:
        """The tile's own slot, or NO_SLOT when it is not resident."""
        return int(self._own[self.flat_index(level, x, y)])

    def resident_tiles(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(level, x, y, slot) of every resident tile."""
        idx = np.flatnonzero(self._own >= 0)
        lv = np.searchsorted(self.level_first, idx, side="right") - 1
        off = idx - self.level_first[lv]
        return lv, off % self.tiles_x[lv], off // self.tiles_x[lv], self._own[idx].astype(np.int64)

    @property
    def is_complete(self) -> bool:
        """True once the coarsest tile is resident: then every page maps to a resident tile."""
        return bool(self._own_v[self.top_level][0, 0] >= 0)

    # ---- updates -------------------------------------------------------------------------------
    def _check_tile(self, level: int, x: int, y: int) -> None:
        if not 0 <= level < self.level_count:
            raise ValueError(f"level {level!r} is outside 0..{self.top_level}")
        tx, ty = int(self.tiles_x[level]), int(self.tiles_y[level])
        if not (0 <= x < tx and 0 <= y < ty):
            raise ValueError(f"tile ({x!r}, {y!r}) is outside level {level}'s {tx}x{ty} page grid")

    def _subrect(self, level: int, x: int, y: int, k: int) -> Rect:
        d = level - k
        return (
            x << d,
            y << d,
            min((x + 1) << d, int(self.tiles_x[k])),
            min((y + 1) << d, int(self.tiles_y[k])),
        )

    def _mark(self, k: int, x0: int, y0: int, mask: np.ndarray) -> None:
        cols = np.flatnonzero(mask.any(axis=0))
        rows = np.flatnonzero(mask.any(axis=1))
        r = (x0 + int(cols[0]), y0 + int(rows[0]), x0 + int(cols[-1]) + 1, y0 + int(rows[-1]) + 1)
        self._union_dirty(k, r)

    def _union_dirty(self, k: int, r: Rect) -> None:
        b = self.dirty_block
        x0, y0, x1, y1 = r
        self._dirty[k][y0 // b : (y1 - 1) // b + 1, x0 // b : (x1 - 1) // b + 1] = True

    def set_resident(self, level: int, x: int, y: int, slot: int) -> None:
        """Tile (level, x, y) now sits in `slot` (arrival, or a move after a pool resize).

        Every page under it whose nearest resident tile was coarser (or this tile) now samples it.
        """
        level, x, y, slot = int(level), int(x), int(y), int(slot)
        self._check_tile(level, x, y)
        if slot < 0:
            raise ValueError(f"slot must be >= 0, got {slot}")
        layer = slot // self.geometry.cells
        if layer >= GPU_NONE:
            raise ValueError(f"slot {slot} is in layer {layer}, beyond the 16-bit page-table limit")
        if self._own_v[level][y, x] < 0:
            self.resident_count += 1
        self._own_v[level][y, x] = slot
        for k in range(level, -1, -1):
            x0, y0, x1, y1 = self._subrect(level, x, y, k)
            res = self._res_v[k][y0:y1, x0:x1]
            mask = res >= level  # NO_LEVEL (255) is >= every level
            if not mask.any():
                break  # a finer resident tile covers all of level k here, hence all finer levels too
            res[mask] = level
            self._slot_v[k][y0:y1, x0:x1][mask] = slot
            self._mark(k, x0, y0, mask)

    def set_absent(self, level: int, x: int, y: int) -> bool:
        """Tile (level, x, y) left its slot (eviction); its pages fall back to the nearest resident
        ancestor. Returns False when it was not resident. ValueError for a pinned level."""
        level, x, y = int(level), int(x), int(y)
        self._check_tile(level, x, y)
        if level >= self.first_pinned_level:
            raise ValueError(f"level {level} is pinned (levels {self.first_pinned_level}..{self.top_level})")
        if self._own_v[level][y, x] < 0:
            return False
        self._own_v[level][y, x] = NO_SLOT
        self.resident_count -= 1
        a_slot, a_level = NO_SLOT, NO_LEVEL
        for up in range(level + 1, self.level_count):
            d = up - level
            s = int(self._own_v[up][y >> d, x >> d])
            if s >= 0:
                a_slot, a_level = s, up
                break
        assert a_slot >= 0 or not self.is_complete, "coarsest tile resident but no resident ancestor found"
        for k in range(level, -1, -1):
            x0, y0, x1, y1 = self._subrect(level, x, y, k)
            res = self._res_v[k][y0:y1, x0:x1]
            mask = res == level
            if not mask.any():
                break
            res[mask] = a_level
            self._slot_v[k][y0:y1, x0:x1][mask] = a_slot
            self._mark(k, x0, y0, mask)
        return True

    def move_slots(self, old_slots: np.ndarray, new_slots: np.ndarray) -> int:
        """Rename slots after a pool resize (vectorized over the whole table); returns pages changed."""
        old = np.asarray(old_slots, np.int64).ravel()
        new = np.asarray(new_slots, np.int64).ravel()
        if old.shape != new.shape:
            raise ValueError(f"old and new slot lists differ in length: {old.size} vs {new.size}")
        if old.size == 0:
            return 0
        order = np.argsort(old)
        old, new = old[order], new[order]
        changed = 0
        for arr, views, is_own in ((self._own, self._own_v, True), (self._slot, self._slot_v, False)):
            pos = np.searchsorted(old, arr)
            pos_c = np.minimum(pos, old.size - 1)
            hit = (arr >= 0) & (old[pos_c] == arr)
            arr[hit] = new[pos_c[hit]]
            if not is_own:
                changed = int(np.count_nonzero(hit))
                for k, v in enumerate(views):
                    m = hit[self.level_first[k] : self.level_first[k + 1]].reshape(v.shape)
                    if m.any():
                        self._mark(k, 0, 0, m)
        return changed

    # ---- GPU data ------------------------------------------------------------------------------
    @property
    def gpu_texture_size(self) -> tuple[int, int]:
        """Width and height of GL level 0: page level 0 padded to powers of two."""
        return _next_pow2(int(self.tiles_x[0])), _next_pow2(int(self.tiles_y[0]))

    @property
    def gpu_level_count(self) -> int:
        w, h = self.gpu_texture_size
        n = max(w, h).bit_length()
        assert n == self.level_count, (n, self.level_count)
        return n

    def gpu_level_size(self, level: int) -> tuple[int, int]:
        w, h = self.gpu_texture_size
        return max(1, w >> level), max(1, h >> level)

    @property
    def bytes_on_gpu(self) -> int:
        """Bytes of the RGBA16UI page-table texture with its whole mip chain (for the budget)."""
        total = 0
        for lv in range(self.gpu_level_count):
            w, h = self.gpu_level_size(lv)
            total += w * h * GPU_TEXEL_BYTES
        return total

    # Alternative layout: one 2-D atlas, level k in rows atlas_level_rows[k] .. + tiles_y[k].
    @property
    def atlas_level_rows(self) -> list[int]:
        """First atlas row of each level when the levels are stacked vertically in one texture."""
        return np.concatenate([[0], np.cumsum(self.tiles_y)[:-1]]).astype(int).tolist()

    @property
    def atlas_size(self) -> tuple[int, int]:
        """Width and height of the stacked-levels atlas (level 0's width, all levels' rows)."""
        return int(self.tiles_x[0]), int(self.tiles_y.sum())

    @property
    def atlas_bytes(self) -> int:
        """Bytes of the RGBA16UI atlas layout (instead of `bytes_on_gpu` for the mip-chain layout)."""
        w, h = self.atlas_size
        return w * h * GPU_TEXEL_BYTES

    def as_texture_data(self, level: int, rect: Rect | None = None) -> np.ndarray:
        """(h, w, 4) uint16 texels of `level` (whole page grid, or `rect` = x0, y0, x1, y1)."""
        if not 0 <= level < self.level_count:
            raise ValueError(f"level {level!r} is outside 0..{self.top_level}")
        tx, ty = int(self.tiles_x[level]), int(self.tiles_y[level])
        x0, y0, x1, y1 = rect if rect is not None else (0, 0, tx, ty)
        if not (0 <= x0 < x1 <= tx and 0 <= y0 < y1 <= ty):
            raise ValueError(f"rectangle {rect!r} is outside level {level}'s {tx}x{ty} page grid")
        slot = self._slot_v[level][y0:y1, x0:x1]
        none = slot < 0
        out = np.zeros((y1 - y0, x1 - x0, 4), np.uint16)
        cells = self.geometry.cells
        if cells == 1:
            out[..., 0] = slot  # NO_SLOT (-1) wraps to GPU_NONE (0xFFFF)
        else:
            layer, cx, cy = self.geometry.locate(slot)
            out[..., 0] = layer
            out[..., 2] = cx
            out[..., 3] = cy
            out[none] = 0
            out[..., 0][none] = GPU_NONE
        out[..., 1] = self._res_v[level][y0:y1, x0:x1]
        out[..., 1][none] = GPU_NONE
        return out

    def dirty_rects(self) -> list[tuple[int, Rect]]:
        """(level, (x0, y0, x1, y1)) regions changed since the last `take_dirty`.

        Changes are tracked per block of `dirty_block` pages a side; dirty blocks are merged into
        horizontal runs, and runs spanning the same columns on consecutive block rows into one
        rectangle, so scattered arrivals upload a few small regions, never a whole level.
        """
        b = self.dirty_block
        out: list[tuple[int, Rect]] = []
        for k, bits in enumerate(self._dirty):
            if not bits.any():
                continue
            tx, ty = int(self.tiles_x[k]), int(self.tiles_y[k])
            edges = np.diff(np.pad(bits, ((0, 0), (1, 1))).astype(np.int8), axis=1)
            open_runs: dict[tuple[int, int], int] = {}  # (bx0, bx1) -> first block row
            for by in range(bits.shape[0] + 1):
                if by < bits.shape[0]:
                    row = edges[by]
                    runs = set(
                        zip(
                            np.flatnonzero(row == 1).tolist(), np.flatnonzero(row == -1).tolist(), strict=True
                        )
                    )
                else:
                    runs = set()
                for run in [r for r in open_runs if r not in runs]:
                    by0 = open_runs.pop(run)
                    out.append((k, (run[0] * b, by0 * b, min(run[1] * b, tx), min(by * b, ty))))
                for run in runs:
                    open_runs.setdefault(run, by)
        return out

    def take_dirty(self) -> list[tuple[int, Rect, np.ndarray]]:
        """(level, rect, texel data) per dirty region, then clears the dirty state: upload these."""
        out = [(k, r, self.as_texture_data(k, r)) for k, r in self.dirty_rects()]
        for bits in self._dirty:
            bits[:] = False
        return out

    def mark_all_dirty(self) -> None:
        """Everything must be uploaded (a new or recreated GPU texture)."""
        for bits in self._dirty:
            bits[:] = True

    # ---- checks --------------------------------------------------------------------------------
    def validate(self) -> None:
        """Assert the tables equal a from-scratch computation (O(pages); tests and debugging)."""
        slot = np.full_like(self._slot, NO_SLOT)
        res = np.full_like(self._res, NO_LEVEL)
        for k in range(self.level_count):
            yy, xx = np.mgrid[0 : int(self.tiles_y[k]), 0 : int(self.tiles_x[k])]
            s = np.full(xx.shape, NO_SLOT, np.int32)
            r = np.full(xx.shape, NO_LEVEL, np.uint8)
            for up in range(self.level_count - 1, k - 1, -1):  # finer wins: overwrite going down
                own = self._own_v[up][yy >> (up - k), xx >> (up - k)]
                hit = own >= 0
                s[hit], r[hit] = own[hit], up
            sl = slice(int(self.level_first[k]), int(self.level_first[k + 1]))
            slot[sl], res[sl] = s.ravel(), r.ravel()
        assert np.array_equal(slot, self._slot), "page-table slots differ from the reference"
        assert np.array_equal(res, self._res), "page-table levels differ from the reference"
        if self.is_complete:
            assert (self._slot >= 0).all(), "a page maps to nothing although the coarsest tile is resident"
