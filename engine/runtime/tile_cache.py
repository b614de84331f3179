"""The tile cache: which physical slot of a format's GPU texture array holds which tile.

One `SlotPool` exists per compression format and is shared by every virtual texture of that format.
The GL texture array itself is owned elsewhere (the render thread); this module is pure bookkeeping
and never touches GL.

Physical layout (`SlotGeometry`): the texture array has ``layers`` layers; each layer is a grid of
``cells_x x cells_y`` slots of ``slot_size`` texels square (``slot_size = T + 2B``, a multiple of 4
so BC blocks never straddle two slots). Slot ``s`` lives in layer ``s // cells`` at cell
``(s % cells) % cells_x, (s % cells) // cells_x`` (``cells = cells_x * cells_y``). With one cell
per layer a slot is a layer; several cells per layer get around ``GL_MAX_ARRAY_TEXTURE_LAYERS``
(2048 on many drivers, i.e. only ~19 MB of 136-texel BC1 slots).

Slot lifecycle (explicit `TileState` per slot)::

    ABSENT (free) --allocate--> LOADING --mark_uploading--> UPLOADING --mark_resident--> RESIDENT
        ^                          |                            |                            |
        +--------- free() ---------+----------------------------+      evicted by allocate()  |
        +------------------------------------------------------------------------------------+

A RESIDENT slot may be evicted only when it is unpinned and its last use is at least
``frames_in_flight`` frames old, so no frame the GPU may still be drawing samples a slot that is
being overwritten. Slots of a released texture cool down for ``frames_in_flight`` frames before
they are handed out again, for the same reason.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import BudgetError

__all__ = [
    "ResizeResult",
    "SlotGeometry",
    "SlotPool",
    "TileRecords",
    "TileState",
    "split_tile_keys",
    "tile_keys",
]

log = logging.getLogger(__name__)

# ---- tile keys ---------------------------------------------------------------------------------
# One int64 per tile: tex (15 bits) | level (6 bits) | y (21 bits) | x (21 bits), always >= 0.
KEY_X_BITS = 21
KEY_Y_BITS = 21
KEY_LEVEL_BITS = 6
KEY_TEX_BITS = 15
MAX_KEY_TEX = (1 << KEY_TEX_BITS) - 1
MAX_KEY_LEVEL = (1 << KEY_LEVEL_BITS) - 1
MAX_KEY_COORD = (1 << KEY_X_BITS) - 1
_Y_SHIFT = KEY_X_BITS
_LEVEL_SHIFT = KEY_X_BITS + KEY_Y_BITS
_TEX_SHIFT = _LEVEL_SHIFT + KEY_LEVEL_BITS


def tile_keys(
    tex: np.ndarray | int, level: np.ndarray | int, x: np.ndarray | int, y: np.ndarray | int
) -> np.ndarray:
    """Encode tiles as int64 keys (vectorized); ValueError when a field does not fit its bits."""
    t, lv, xx, yy = (np.asarray(a, dtype=np.int64) for a in (tex, level, x, y))
    for name, arr, hi in (("texture id", t, MAX_KEY_TEX), ("level", lv, MAX_KEY_LEVEL),
                          ("x", xx, MAX_KEY_COORD), ("y", yy, MAX_KEY_COORD)):  # fmt: skip
        if arr.size and (arr.min() < 0 or arr.max() > hi):
            raise ValueError(f"tile {name} out of range 0..{hi}: min {arr.min()}, max {arr.max()}")
    return (t << _TEX_SHIFT) | (lv << _LEVEL_SHIFT) | (yy << _Y_SHIFT) | xx


def split_tile_keys(keys: np.ndarray | int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Decode int64 keys into (tex, level, x, y) int64 arrays."""
    k = np.asarray(keys, dtype=np.int64)
    return (
        k >> _TEX_SHIFT,
        (k >> _LEVEL_SHIFT) & MAX_KEY_LEVEL,
        k & MAX_KEY_COORD,
        (k >> _Y_SHIFT) & MAX_KEY_COORD,
    )


# ---- states and records ------------------------------------------------------------------------
class TileState(enum.IntEnum):
    """Where a tile is in its life (stored as uint8 in state arrays; ABSENT is 0 = zero-filled).

    The scheduler owns REQUESTED (queued, no slot), LOADING (issued) and FAILED (backing off); a
    slot pool uses ABSENT (free), LOADING (slot reserved, bytes not yet in the staging ring),
    UPLOADING (GPU upload issued, fence pending) and RESIDENT.
    """

    ABSENT = 0
    REQUESTED = 1
    FAILED = 2
    LOADING = 3
    UPLOADING = 4
    RESIDENT = 5


@dataclass(frozen=True)
class TileRecords:
    """Parallel arrays naming tiles and the slot each held (or moved to)."""

    slot: np.ndarray
    tex: np.ndarray
    level: np.ndarray
    x: np.ndarray
    y: np.ndarray

    @classmethod
    def empty(cls) -> TileRecords:
        z = np.zeros(0, np.int64)
        return cls(z, z, z, z, z)

    @classmethod
    def concat(cls, parts: list[TileRecords]) -> TileRecords:
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        return cls(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in ("slot", "tex", "level", "x", "y"))
        )

    def __len__(self) -> int:
        return int(self.slot.shape[0])

    def keys(self) -> np.ndarray:
        return tile_keys(self.tex, self.level, self.x, self.y)

    def tuples(self) -> list[tuple[int, int, int, int, int]]:
        """(slot, tex, level, x, y) per record; for small lists (tests, logs)."""
        return list(
            zip(*(a.tolist() for a in (self.slot, self.tex, self.level, self.x, self.y)), strict=True)
        )


@dataclass(frozen=True)
class ResizeResult:
    """What the GPU side must do after `SlotPool.resize`.

    Create the new array of ``new_layers`` layers, copy layers ``0 .. min(old, new) - 1`` of the old
    array wholesale, then copy each moved slot ``moves_from[i]`` (old array) to ``moves_to[i]`` (new
    array) with glCopyImageSubData, then drop the old array. `moved` names the tiles now at
    `moves_to` (update their page-table entries); `evicted` lost their slot (set them absent);
    `cancelled` were in-flight loads whose slot disappeared (discard their pending upload and tell the
    scheduler to drop them).
    """

    old_layers: int
    new_layers: int
    moves_from: np.ndarray
    moves_to: np.ndarray
    moved: TileRecords
    evicted: TileRecords
    cancelled: TileRecords


@dataclass(frozen=True)
class SlotGeometry:
    """How slots are laid out in a texture array: `cells_x` x `cells_y` slots per layer."""

    slot_size: int  # texels a side of one slot (T + 2B)
    slot_bytes: int  # GPU bytes of one slot in its texel format
    cells_x: int = 1
    cells_y: int = 1

    def __post_init__(self) -> None:
        if self.slot_size < 4 or self.slot_size % 4:
            raise ValueError(f"slot size must be a positive multiple of 4 texels, got {self.slot_size!r}")
        if self.slot_bytes < 1:
            raise ValueError(f"slot bytes must be positive, got {self.slot_bytes!r}")
        if self.cells_x < 1 or self.cells_y < 1:
            raise ValueError(f"cells per layer must be >= 1, got {self.cells_x!r} x {self.cells_y!r}")

    @classmethod
    def choose(
        cls,
        slot_size: int,
        slot_bytes: int,
        max_slots: int,
        *,
        max_layers: int = 2048,
        max_texture_size: int = 16384,
    ) -> SlotGeometry:
        """Smallest square cell grid whose layers can hold `max_slots` within the GL limits.

        Small grids keep resizing fine-grained (a pool grows and shrinks by whole layers).
        """
        if max_slots < 1 or max_layers < 1:
            raise ValueError(f"max_slots and max_layers must be >= 1, got {max_slots!r}, {max_layers!r}")
        g = max(1, math.isqrt(-(-max_slots // max_layers)))
        while g * g * max_layers < max_slots:
            g += 1
        if g * slot_size > max_texture_size:
            raise ValueError(
                f"{max_slots} slots of {slot_size} texels need layers of {g * slot_size} texels, "
                f"above the {max_texture_size}-texel limit"
            )
        return cls(slot_size=slot_size, slot_bytes=slot_bytes, cells_x=g, cells_y=g)

    @property
    def cells(self) -> int:
        """Slots per layer."""
        return self.cells_x * self.cells_y

    @property
    def layer_size(self) -> tuple[int, int]:
        """Texel width and height of one layer."""
        return self.cells_x * self.slot_size, self.cells_y * self.slot_size

    @property
    def layer_bytes(self) -> int:
        return self.cells * self.slot_bytes

    def round_capacity(self, slots: int) -> int:
        """`slots` rounded down to whole layers."""
        return max(0, slots) // self.cells * self.cells

    def locate(self, slots: np.ndarray | int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(layer, cell x, cell y) of each slot (vectorized). Texel origin = cell * slot_size."""
        s = np.asarray(slots, dtype=np.int64)
        cell = s % self.cells
        return s // self.cells, cell % self.cells_x, cell // self.cells_x


# ---- the pool ----------------------------------------------------------------------------------
@dataclass
class _Stats:
    allocations: int = 0
    evictions: int = 0
    frees: int = 0
    allocation_failures: int = 0


class SlotPool:
    """Slot bookkeeping for one format's texture array of `capacity` slots.

    Args:
        name: pool name, used in logs and as the budget reservation key (e.g. ``"pool/bc1"``).
        capacity: slots; a multiple of ``geometry.cells`` (whole layers).
        geometry: slot size, bytes and cells per layer.
        frames_in_flight: a tile last used at frame N may be evicted from frame N + frames_in_flight.
        on_evict: called with the `TileRecords` evicted by each `allocate_many` call (besides being
            queued for `take_evicted`).
    """

    def __init__(
        self,
        name: str,
        capacity: int,
        geometry: SlotGeometry,
        frames_in_flight: int,
        *,
        on_evict: Callable[[TileRecords], None] | None = None,
    ) -> None:
        if frames_in_flight < 1:
            raise ValueError(f"frames_in_flight must be >= 1, got {frames_in_flight!r}")
        self._check_capacity(capacity, geometry)
        self.name = name
        self.geometry = geometry
        self.frames_in_flight = frames_in_flight
        self.on_evict = on_evict
        self._capacity = 0
        self.state = np.zeros(0, np.uint8)
        self.tex = np.zeros(0, np.int32)
        self.level = np.zeros(0, np.int8)
        self.x = np.zeros(0, np.int32)
        self.y = np.zeros(0, np.int32)
        self.last_used = np.zeros(0, np.int64)
        self.pinned = np.zeros(0, bool)
        self._free: list[int] = []  # stack; pops lowest slot first
        self._cooling: list[tuple[int, int]] = []  # (slot, frame from which it may be reused)
        self._slot_of: dict[int, int] = {}  # tile key -> slot, for every non-free slot
        self._evicted: list[TileRecords] = []
        self.stats = _Stats()
        self._grow(capacity)

    # ---- properties ---------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def layers(self) -> int:
        return self._capacity // self.geometry.cells

    @property
    def bytes_on_gpu(self) -> int:
        return self._capacity * self.geometry.slot_bytes

    @property
    def free_count(self) -> int:
        """Slots free now or after cooling down."""
        return len(self._free) + len(self._cooling)

    @property
    def used_count(self) -> int:
        return len(self._slot_of)

    @property
    def resident_count(self) -> int:
        return int(np.count_nonzero(self.state == TileState.RESIDENT))

    @property
    def pinned_count(self) -> int:
        return int(np.count_nonzero(self.pinned))

    def evictable_mask(self, frame: int) -> np.ndarray:
        return (
            (self.state == TileState.RESIDENT)
            & ~self.pinned
            & (self.last_used <= frame - self.frames_in_flight)
        )

    def evictable_count(self, frame: int) -> int:
        return int(np.count_nonzero(self.evictable_mask(frame)))

    def slot_of(self, tex: int, level: int, x: int, y: int) -> int | None:
        """Slot holding (or loading) a tile, or None."""
        return self._slot_of.get(int(tile_keys(tex, level, x, y)))

    def keys(self) -> np.ndarray:
        """Tile key of each slot; -1 for free slots."""
        k = np.full(self._capacity, -1, np.int64)
        used = self.state != TileState.ABSENT
        k[used] = tile_keys(self.tex[used], self.level[used], self.x[used], self.y[used])
        return k

    # ---- allocation ---------------------------------------------------------------------------
    def allocate(self, frame: int, tex: int, level: int, x: int, y: int) -> int | None:
        """Reserve a slot for one tile (state LOADING): a free one, else the LRU evictable one."""
        slots = self.allocate_many(frame, np.array([tex]), np.array([level]), np.array([x]), np.array([y]))
        return None if slots[0] < 0 else int(slots[0])

    def allocate_many(
        self, frame: int, tex: np.ndarray, level: np.ndarray, x: np.ndarray, y: np.ndarray
    ) -> np.ndarray:
        """Reserve slots for tiles in order (state LOADING); returns the slots, -1 where none was left.

        Free slots go first; then the least recently used evictable slots (unpinned, RESIDENT, last
        used <= frame - frames_in_flight; ties: finer levels first), chosen with one argpartition.
        """
        tex, level, x, y = (np.asarray(a, dtype=np.int64).ravel() for a in (tex, level, x, y))
        n = tex.shape[0]
        if not (level.shape[0] == x.shape[0] == y.shape[0] == n):
            raise ValueError(
                f"tile arrays differ in length: {tex.shape}, {level.shape}, {x.shape}, {y.shape}"
            )
        out = np.full(n, -1, np.int64)
        if n == 0:
            return out
        keys = tile_keys(tex, level, x, y)
        if np.unique(keys).shape[0] != n:
            raise ValueError(f"{self.name}: the same tile is listed twice in one allocation")
        for k in keys.tolist():
            if k in self._slot_of:
                t, lv, xx, yy = (int(v) for v in split_tile_keys(k))
                raise ValueError(
                    f"{self.name}: tile (tex {t}, level {lv}, {xx}, {yy}) "
                    f"already holds slot {self._slot_of[k]}"
                )
        self._recycle_cooled(frame)
        take = min(n, len(self._free))
        if take:
            out[:take] = [self._free.pop() for _ in range(take)]
        need = n - take
        if need:
            victims = self._pick_victims(frame, need)
            if victims.size:
                evicted = self._records(victims)
                for k in evicted.keys().tolist():
                    del self._slot_of[k]
                self.stats.evictions += victims.size
                self._evicted.append(evicted)
                if self.on_evict is not None:
                    self.on_evict(evicted)
                out[take : take + victims.size] = victims
        got = out >= 0
        s = out[got]
        self.state[s] = TileState.LOADING
        self.tex[s], self.level[s], self.x[s], self.y[s] = tex[got], level[got], x[got], y[got]
        self.last_used[s] = frame
        self.pinned[s] = False
        for k, slot in zip(keys[got].tolist(), s.tolist(), strict=True):
            self._slot_of[k] = slot
        self.stats.allocations += s.size
        failed = n - s.size
        if failed:
            self.stats.allocation_failures += failed
            log.debug(
                "%s: %d of %d allocations found no evictable slot at frame %d", self.name, failed, n, frame
            )
        return out

    def _pick_victims(self, frame: int, count: int) -> np.ndarray:
        candidates = np.flatnonzero(self.evictable_mask(frame))
        if candidates.size == 0:
            return candidates
        # Oldest first; among equally old, finer levels first (coarser ones back more pages); then
        # lowest slot, so the choice is deterministic.
        age = self.last_used[candidates] * 64 + self.level[candidates].astype(np.int64)
        order_key = age * self._capacity + candidates
        if candidates.size > count:
            part = np.argpartition(order_key, count - 1)[:count]
            candidates, order_key = candidates[part], order_key[part]
        return candidates[np.argsort(order_key, kind="stable")]

    def _recycle_cooled(self, frame: int) -> None:
        if not self._cooling:
            return
        ready = [s for s, at in self._cooling if at <= frame]
        if ready:
            self._cooling = [(s, at) for s, at in self._cooling if at > frame]
            self._free.extend(sorted(ready, reverse=True))

    def take_evicted(self) -> TileRecords:
        """Tiles evicted since the last call (their page-table entries must be set absent)."""
        out = TileRecords.concat(self._evicted)
        self._evicted.clear()
        return out

    # ---- state transitions ----------------------------------------------------------------------
    def _slots(self, slots: np.ndarray | int | list[int], what: str) -> np.ndarray:
        s = np.asarray(slots, dtype=np.int64).ravel()
        if s.size and (s.min() < 0 or s.max() >= self._capacity):
            raise ValueError(
                f"{self.name}: {what} slot out of range 0..{self._capacity - 1}: {s.min()}..{s.max()}"
            )
        return s

    def _require(self, s: np.ndarray, states: tuple[TileState, ...], what: str) -> None:
        ok = np.isin(self.state[s], np.array(states, np.uint8))
        if not ok.all():
            bad = int(s[~ok][0])
            raise ValueError(
                f"{self.name}: cannot {what} slot {bad} in state {TileState(int(self.state[bad])).name}"
            )

    def mark_uploading(self, slots: np.ndarray | int | list[int]) -> None:
        """LOADING -> UPLOADING: the tile's bytes are in the staging ring and the upload is issued."""
        s = self._slots(slots, "uploading")
        self._require(s, (TileState.LOADING,), "mark uploading")
        self.state[s] = TileState.UPLOADING

    def mark_resident(self, slots: np.ndarray | int | list[int], frame: int) -> None:
        """LOADING/UPLOADING -> RESIDENT (the upload fence signalled); counts as a use at `frame`."""
        s = self._slots(slots, "resident")
        self._require(s, (TileState.LOADING, TileState.UPLOADING), "mark resident")
        self.state[s] = TileState.RESIDENT
        self.last_used[s] = np.maximum(self.last_used[s], frame)

    def free(self, slots: np.ndarray | int | list[int]) -> TileRecords:
        """Give back in-flight slots whose load failed or was dropped (never sampled: no cooling)."""
        s = np.unique(self._slots(slots, "free"))
        self._require(s, (TileState.LOADING, TileState.UPLOADING), "free")
        rec = self._records(s)
        self._clear(s)
        self._free.extend(sorted(s.tolist(), reverse=True))
        self.stats.frees += s.size
        return rec

    def touch(self, slots: np.ndarray | int | list[int], frame: int) -> None:
        """Record a use at `frame` of every listed slot (-1 entries and free slots ignored)."""
        s = np.asarray(slots, dtype=np.int64).ravel()
        s = s[(s >= 0) & (s < self._capacity)]
        s = s[self.state[s] != TileState.ABSENT]
        self.last_used[s] = np.maximum(self.last_used[s], frame)

    def pin(self, slots: np.ndarray | int | list[int]) -> None:
        """Never evict these slots (the coarsest levels). Pin before or after they are resident."""
        s = self._slots(slots, "pin")
        self._require(s, (TileState.LOADING, TileState.UPLOADING, TileState.RESIDENT), "pin")
        self.pinned[s] = True

    def unpin(self, slots: np.ndarray | int | list[int]) -> None:
        s = self._slots(slots, "unpin")
        self.pinned[s] = False

    def release_texture(self, tex_id: int, frame: int) -> TileRecords:
        """Drop every slot of a texture (pinned and in-flight included); returns what it held.

        Resident slots cool down for frames_in_flight frames before reuse; in-flight slots are
        reusable at once (their pending uploads must be discarded by the caller).
        """
        s = np.flatnonzero((self.tex == tex_id) & (self.state != TileState.ABSENT))
        rec = self._records(s)
        resident = s[self.state[s] == TileState.RESIDENT]
        inflight = s[self.state[s] != TileState.RESIDENT]
        self._clear(s)
        ready = frame + self.frames_in_flight
        self._cooling.extend((int(v), ready) for v in resident.tolist())
        self._free.extend(sorted(inflight.tolist(), reverse=True))
        log.debug("%s: released texture %d (%d slots)", self.name, tex_id, s.size)
        return rec

    def _records(self, s: np.ndarray) -> TileRecords:
        return TileRecords(
            s.astype(np.int64),
            self.tex[s].astype(np.int64),
            self.level[s].astype(np.int64),
            self.x[s].astype(np.int64),
            self.y[s].astype(np.int64),
        )

    def _clear(self, s: np.ndarray) -> None:
        for k in self._records(s).keys().tolist():
            del self._slot_of[k]
        self.state[s] = TileState.ABSENT
        self.tex[s] = -1
        self.pinned[s] = False

    # ---- resizing -----------------------------------------------------------------------------
    @staticmethod
    def _check_capacity(capacity: int, geometry: SlotGeometry) -> None:
        cells = geometry.cells
        if not isinstance(capacity, int | np.integer) or capacity < cells or capacity % cells:
            raise ValueError(
                f"capacity must be a positive multiple of {cells} slots (whole layers), got {capacity!r}"
            )

    def _grow(self, capacity: int) -> None:
        old = self._capacity
        extra = capacity - old

        def ext(a: np.ndarray, fill: int | bool) -> np.ndarray:
            return np.concatenate([a, np.full(extra, fill, a.dtype)])

        self.state = ext(self.state, TileState.ABSENT)
        self.tex = ext(self.tex, -1)
        self.level = ext(self.level, 0)
        self.x = ext(self.x, 0)
        self.y = ext(self.y, 0)
        self.last_used = ext(self.last_used, np.iinfo(np.int64).min // 2)
        self.pinned = ext(self.pinned, False)
        self._free = list(range(capacity - 1, old - 1, -1)) + self._free
        self._capacity = capacity

    def resize(self, new_capacity: int) -> ResizeResult:
        """Grow or shrink the pool to `new_capacity` slots (whole layers).

        Shrinking keeps every pinned tile, every in-flight slot in the kept layers and then the most
        recently used resident tiles; survivors from removed layers move into free slots of the kept
        layers. Raises BudgetError, changing nothing, when the pinned tiles do not fit.
        """
        self._check_capacity(new_capacity, self.geometry)
        old_capacity, old_layers = self._capacity, self.layers
        if new_capacity >= old_capacity:
            if new_capacity > old_capacity:
                self._grow(new_capacity)
                log.info("%s: grown from %d to %d slots", self.name, old_capacity, new_capacity)
            e = np.zeros(0, np.int64)
            return ResizeResult(old_layers, self.layers, e, e, TileRecords.empty(), TileRecords.empty(),
                                TileRecords.empty())  # fmt: skip

        idx = np.arange(old_capacity)
        kept_region = idx < new_capacity
        resident = self.state == TileState.RESIDENT
        inflight = (self.state == TileState.LOADING) | (self.state == TileState.UPLOADING)
        pinned = self.pinned & (self.state != TileState.ABSENT)
        # In-flight pinned tiles outside the kept layers are cancelled like other in-flight ones.
        must = (pinned & resident) | (inflight & kept_region)
        n_must = int(np.count_nonzero(must))
        if n_must > new_capacity:
            n_pinned = int(np.count_nonzero(pinned & resident))
            raise BudgetError(
                f"{self.name}: cannot shrink to {new_capacity} slots: {n_pinned} pinned tiles plus "
                f"{n_must - n_pinned} in-flight uploads in the kept layers need {n_must}"
            )
        optional = np.flatnonzero(resident & ~must)
        room = new_capacity - n_must
        if optional.size > room:
            # Most recently used first; among equals, coarser levels first.
            key = self.last_used[optional] * 64 + self.level[optional].astype(np.int64)
            order = np.lexsort((optional, -key))
            survivors_opt, dropped = optional[order[:room]], optional[order[room:]]
        else:
            survivors_opt, dropped = optional, np.zeros(0, np.int64)
        survivors = np.concatenate([np.flatnonzero(must), survivors_opt])
        cancelled = np.flatnonzero(inflight & ~kept_region)
        movers = np.sort(survivors[survivors >= new_capacity])

        evicted_rec = self._records(np.sort(dropped))
        cancelled_rec = self._records(cancelled)
        survivor_mask = np.zeros(old_capacity, bool)
        survivor_mask[survivors] = True
        targets = np.flatnonzero(kept_region & ~survivor_mask)[: movers.size]
        assert targets.size == movers.size, "survivors exceed the new capacity"

        # Apply: clear the dropped and cancelled, move the movers into their targets, truncate.
        for k in TileRecords.concat([evicted_rec, cancelled_rec]).keys().tolist():
            del self._slot_of[k]
        gone = np.concatenate([dropped, cancelled]).astype(np.int64)
        self.state[gone] = TileState.ABSENT
        for arr in (self.state, self.tex, self.level, self.x, self.y, self.last_used, self.pinned):
            arr[targets] = arr[movers]
        moved_rec = self._records(targets)
        for k, slot in zip(moved_rec.keys().tolist(), targets.tolist(), strict=True):
            self._slot_of[k] = slot
        for name in ("state", "tex", "level", "x", "y", "last_used", "pinned"):
            setattr(self, name, getattr(self, name)[:new_capacity].copy())
        absent = self.state == TileState.ABSENT
        self.tex[absent] = -1
        self.pinned[absent] = False
        self._capacity = new_capacity
        free = np.flatnonzero(self.state == TileState.ABSENT)
        self._free = free[::-1].tolist()
        self._cooling = []  # the new array is a fresh texture: nothing in flight samples it
        self.stats.evictions += dropped.size
        assert len(self._slot_of) == int(np.count_nonzero(self.state != TileState.ABSENT))
        log.info(
            "%s: shrunk from %d to %d slots (%d layers): %d moved, %d evicted, %d cancelled",
            self.name, old_capacity, new_capacity, self.layers, movers.size, dropped.size, cancelled.size,
        )  # fmt: skip
        return ResizeResult(
            old_layers, self.layers, movers.astype(np.int64), targets.astype(np.int64),
            moved_rec, evicted_rec, cancelled_rec,
        )  # fmt: skip

    def check(self) -> None:
        """Assert internal consistency (tests and debug builds)."""
        used = self.state != TileState.ABSENT
        assert len(self._slot_of) == int(np.count_nonzero(used))
        free = set(self._free) | {s for s, _ in self._cooling}
        assert len(free) == len(self._free) + len(self._cooling)
        assert free == set(np.flatnonzero(~used).tolist())
        assert not (self.pinned & ~used).any()
