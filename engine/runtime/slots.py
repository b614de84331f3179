"""Cache-slot bookkeeping without GL: `SlotLedger` (one per cache pool), slot geometry and pool sizing.

A `SlotLedger` decides which tile each slot of a cache pool holds: it allocates, keeps slots free
ahead of demand, picks least-recently-used victims, marks loads resident, frees failed loads, records
uses, pins, releases a closed texture's slots and plans shrinks. It holds plain numpy arrays, makes
no GL call and starts no thread; `pools.CachePool` pairs one ledger with the GL texture array and
carries out the ledger's move plans (the GPU copies of a resize).

Slots handed out together come as few runs of consecutive slots as possible (`Allocation.runs`):
free slots are taken lowest first and the victims of one allocation are handed out in slot order,
so the loads of one frame land in consecutive layers of one cell and can be uploaded a run per call
(one glCompressedTexSubImage3D of depth n writes n consecutive layers at one cell).

Physical layout (`SlotGeometry`): the texture array has ``layers`` layers; each layer is a grid of
``cells_x x cells_y`` slots of ``slot_size`` texels square (``slot_size = T + 2B``, a multiple of 4 so
BC blocks never straddle two slots). Slots are numbered cell-major: slot ``s`` lives at cell
``c = s // layers`` (x ``c % cells_x``, y ``c // cells_x``) in layer ``s % layers``, so consecutive
slots are consecutive layers of one cell. Several cells per layer get around
``GL_MAX_ARRAY_TEXTURE_LAYERS`` (2048 on many drivers: only ~19 MB of 136-texel BC1 slots). The
numbering depends on the layer count: a resize renumbers every slot that survives it
(`ResizeResult.moved_from` / ``moved_to`` list them all, loading slots included).

Slot lifecycle (`CacheSlotState`)::

    FREE --allocate--> LOADING --mark_resident--> RESIDENT --(evicted by allocate)--> LOADING ...
      ^                   |                           |
      +------ free -------+-------- release_texture --+

A RESIDENT slot is evicted only when unpinned and unused (per feedback) for ``frames_in_flight``
frames. Victims are the longest idle, idle time divided by their texture's priority (`weigh_by`:
priority-weighted least recently used; a priority-2 tile idle 8 frames goes after a priority-1 tile
idle 5), picked by the ledger's `victims.VictimPicker`. Independently, a slot whose tile left it at
frame E is not overwritten before frame ``E + frames_in_flight`` (`writable_at`): draws issued
before E may still be in flight and sample it through their page tables, and waiting avoids an
implicit GPU sync on the upload. When the GPU is known to have finished every draw issued before E
(a fence behind frame E - 1 signalled: `open_gates_before`), the slot is writable at once: a view
cut then loads into the slots it evicts in the next frame instead of ``frames_in_flight`` frames
later.

Pools are sized together (`plan_capacities`): what the budget leaves after the fixed costs is shared
in proportion to the number of textures per pool times the slot bytes (equal slots per texture:
an albedo and its normal map want about as many tiles each), each pool at least its pinned tiles,
never more than its textures' tile count.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from ..errors import BudgetError
from .int_sets import sorted_unique
from .ledger_loops import LedgerLoops
from .victims import SLOT_BITS, VictimPicker

__all__ = [
    "MAX_POOLS",
    "RUN_DTYPE",
    "Allocation",
    "CacheSlotState",
    "ResizeResult",
    "ShrinkPlan",
    "SlotGeometry",
    "SlotLedger",
    "slot_runs",
]

MAX_POOLS = 16  # cache pools at once (each samples its own texture unit)
NEVER = np.iinfo(np.int64).min // 4


class CacheSlotState(enum.IntEnum):
    """A cache slot's state (uint8 in `SlotLedger.state`)."""

    FREE = 0
    LOADING = 1  # reserved for a load in the uploader (nothing valid in it yet)
    RESIDENT = 2  # holds its tile; page tables may point at it


# plain ints of the states for per-frame array code (enum attribute lookups are slow)
_FREE = int(CacheSlotState.FREE)
_LOADING = int(CacheSlotState.LOADING)
_RESIDENT = int(CacheSlotState.RESIDENT)

#: One run of consecutive cache slots: the first slot, its layer, and how many slots follow.
RUN_DTYPE = np.dtype([("first_slot", np.int64), ("first_layer", np.int64), ("count", np.int64)])


def slot_runs(slots: np.ndarray, layers: int) -> np.ndarray:
    """Maximal runs of consecutive slot numbers in `slots` that stay in one cell (in the given order;
    -1 entries end a run and are skipped), as a `RUN_DTYPE` array, for a pool of `layers` layers.
    A run is a range of consecutive layers at one cell: one upload call can fill it."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers!r}")
    s = np.asarray(slots, np.int64).ravel()
    s = s[s >= 0]
    if s.size == 0:
        return np.zeros(0, RUN_DTYPE)
    breaks = (np.diff(s) != 1) | (s[1:] % layers == 0)  # a new cell starts a new run
    starts = np.concatenate([[True], breaks]).nonzero()[0]
    counts = np.diff(np.concatenate([starts, [s.size]]))
    out = np.empty(starts.size, RUN_DTYPE)
    out["first_slot"] = s[starts]
    out["first_layer"] = s[starts] % layers
    out["count"] = counts
    return out


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
        if self.cells_x < 1 or self.cells_y < 1 or self.cells_x != self.cells_y:
            raise ValueError(f"cells per layer must be a square grid >= 1, got {self.cells_x!r} x {self.cells_y!r}")

    @classmethod
    def choose(
        cls, slot_size: int, slot_bytes: int, max_slots: int, *, max_layers: int = 2048, max_texture_size: int = 16384
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

    def round_up(self, slots: int) -> int:
        """`slots` rounded up to whole layers."""
        return -(-max(0, slots) // self.cells) * self.cells

    def locate(self, slots: np.ndarray | int, layers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(layer, cell x, cell y) of each slot of a pool of `layers` layers (vectorized; slots are
        numbered cell-major). Texel origin = cell * slot_size."""
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers!r}")
        s = np.asarray(slots, dtype=np.int64)
        cell = s // layers
        return s % layers, cell % self.cells_x, cell // self.cells_x

    def renumber(self, slots: np.ndarray, old_layers: int, new_layers: int) -> np.ndarray:
        """The number each slot of a pool of `old_layers` layers has in one of `new_layers` layers
        (same cell, same layer; the layer must exist in both)."""
        s = np.asarray(slots, dtype=np.int64)
        layer = s % old_layers
        if layer.size and int(layer.max(initial=0)) >= new_layers:
            raise ValueError(f"layer {int(layer.max())} does not exist in a pool of {new_layers} layers")
        return s // old_layers * new_layers + layer


@dataclass(frozen=True)
class Allocation:
    """What `SlotLedger.allocate` did: a slot per requested tile (-1: none), the tiles it evicted (in
    eviction order: least recently used first) and the slots handed out as runs (`runs`, worked out
    when asked: a frame's reservations do not need them)."""

    slots: np.ndarray
    evicted_tiles: np.ndarray
    evicted_slots: np.ndarray
    evicted_last_used: np.ndarray  # frame of each evicted tile's last use
    layers: int = 1  # the pool's layer count when the slots were handed out

    @classmethod
    def empty(cls) -> Allocation:
        e = np.zeros(0, np.int64)
        return cls(e, e, e, e)

    @property
    def runs(self) -> np.ndarray:
        """The slots handed out as runs of consecutive slots in one cell (`RUN_DTYPE`, ascending)."""
        return slot_runs(np.sort(self.slots[self.slots >= 0]), self.layers)


@dataclass(frozen=True)
class ResizeResult:
    """What a resize did besides the GPU copy: slots renamed (every held slot whose number changed,
    resident or loading: ``moved_from[i]`` is now ``moved_to[i]``), tiles that lost their slot, and
    tiles that were loading in a removed layer (their loads must be cancelled)."""

    moved_from: np.ndarray
    moved_to: np.ndarray
    evicted_tiles: np.ndarray
    cancelled_tiles: np.ndarray
    cancelled_slots: np.ndarray

    @classmethod
    def empty(cls) -> ResizeResult:
        e = np.zeros(0, np.int64)
        return cls(e, e, e, e, e)


@dataclass(frozen=True, kw_only=True)
class ShrinkPlan:
    """A shrink decided by `SlotLedger.plan_shrink` and not yet applied: the slots that stay, those
    whose tiles are dropped, the loading slots of removed layers, and where movers go."""

    capacity: int
    survivors: np.ndarray
    dropped: np.ndarray
    cancelled: np.ndarray
    moved_from: np.ndarray  # survivors in removed layers ...
    moved_to: np.ndarray  # ... and the free slots of the kept layers they move into


class SlotLedger:
    """Which tile each slot of one cache pool holds, and in which `CacheSlotState`. No GL.

    A frame's arrivals and uses in every pool at once go through `pool_ledgers.PoolLedgers`, the
    one other writer of `state` and `last_used` (one compiled call for all pools, to the same state
    as `mark_resident` and `touch` pool by pool).

    Parameters
    ----------
    name
        The pool's name, for error messages.
    capacity
        Slots, a multiple of `cells`.
    frames_in_flight
        Eviction delay and overwrite delay in frames.
    cells
        Slots per layer (capacities are whole layers).
    """

    def __init__(self, name: str, capacity: int, frames_in_flight: int, cells: int = 1) -> None:
        if frames_in_flight < 1:
            raise ValueError(f"frames_in_flight must be >= 1, got {frames_in_flight!r}")
        if cells < 1:
            raise ValueError(f"cells per layer must be >= 1, got {cells!r}")
        self.name, self.frames_in_flight, self.cells = name, frames_in_flight, cells
        self.check_capacity(capacity)
        self.capacity = 0
        self.state = np.zeros(0, np.uint8)
        self.tile = np.zeros(0, np.int64)  # tile id per slot (-1: free)
        self.tex = np.zeros(0, np.int16)  # texture id per slot (-1: free)
        self.level = np.zeros(0, np.int8)
        self.last_used = np.zeros(0, np.int64)
        self.pinned = np.zeros(0, bool)
        self.writable_at = np.zeros(0, np.int64)  # frame from which the slot may be overwritten
        # slots given an overwrite gate, in the order they were gated (may repeat), and each entry's gate
        # (the frame it was gated at + frames_in_flight): ascending, so the gates to look at are a prefix
        self._gated = np.zeros(0, np.int64)
        self._gated_until = np.zeros(0, np.int64)
        self._free = np.zeros(0, np.int64)  # stack of free slots, lowest on top
        self.victims = VictimPicker(frames_in_flight, _RESIDENT)  # the LRU victims (`weigh_by`)
        self.grow(capacity)

    # ---- counts ---------------------------------------------------------------------------------
    @property
    def layers(self) -> int:
        """Layers of the pool's array (slot numbers depend on it: see the module docstring)."""
        return self.capacity // self.cells

    @property
    def free_count(self) -> int:
        return int(self._free.size)

    @property
    def used_count(self) -> int:
        return self.capacity - self.free_count

    @property
    def resident_count(self) -> int:
        return int(np.count_nonzero(self.state == _RESIDENT))

    @property
    def pinned_count(self) -> int:
        return int(np.count_nonzero(self.pinned))

    def resident_tile_ids(self) -> np.ndarray:
        """Tile id of every RESIDENT slot (in slot order)."""
        return self.tile[self.state == _RESIDENT]

    def evictable_mask(self, frame: int) -> np.ndarray:
        return (self.state == _RESIDENT) & ~self.pinned & (self.last_used <= frame - self.frames_in_flight)

    # ---- allocation -----------------------------------------------------------------------------
    def allocate(self, frame: int, tiles: np.ndarray, tex: np.ndarray, levels: np.ndarray) -> Allocation:
        """Reserve a slot per tile, in order (state LOADING): free slots first, then the least recently
        used evictable ones (unpinned, RESIDENT, unused for frames_in_flight frames; among equals finer
        levels first), chosen with one argpartition. -1 where nothing was left. The slots handed out
        are in ascending order within the free ones and within the victims, so they form few runs."""
        tiles = np.asarray(tiles, np.int64).ravel()
        n = tiles.size
        out = np.full(n, -1, np.int64)
        if n == 0:
            return Allocation.empty()
        take = min(n, self._free.size)
        if take:
            top = self._free[self._free.size - take :][::-1]  # lowest free slots
            if np.any(self.writable_at[top] > frame):
                # some free slots wait for draws in flight (a released texture's): the lowest writable
                # ones first, then the lowest waiting ones; the rest stay in order (no sort)
                asc = self._free[::-1]
                wait = self.writable_at[asc] > frame
                picked = np.concatenate([(~wait).nonzero()[0], wait.nonzero()[0]])[:take]
                top = asc[picked]
                rest = np.ones(asc.size, bool)
                rest[picked] = False
                self._free = asc[rest][::-1]
            else:
                self._free = self._free[: self._free.size - take]
            out[:take] = top
        victims = self._pick_victims(frame, n - take) if n > take else np.zeros(0, np.int64)
        evicted_tiles = self.tile[victims].copy()
        evicted_last_used = self.last_used[victims].copy()
        if victims.size:
            out[take : take + victims.size] = np.sort(victims)  # slot order: runs for the uploads
            self._gate(victims, frame)
        got = out >= 0
        s = out[got]
        self.state[s] = _LOADING
        self.tile[s] = tiles[got]
        self.tex[s] = np.asarray(tex, np.int64).ravel()[got]
        self.level[s] = np.asarray(levels, np.int64).ravel()[got]
        self.last_used[s] = frame
        self.pinned[s] = False
        return Allocation(out, evicted_tiles, victims, evicted_last_used, self.layers)

    def keep_free(self, frame: int, count: int) -> Allocation:
        """Evict least recently used tiles (unused for frames_in_flight frames) until `count` slots are
        free, so that loads of the next frames find slots past their overwrite gate instead of waiting
        frames_in_flight frames for a slot evicted on demand. Returns the evicted tiles."""
        short = count - self._free.size
        if short <= 0:
            return Allocation.empty()
        victims = self._pick_victims(frame, short)
        tiles, last = self.tile[victims].copy(), self.last_used[victims].copy()
        self._gate(victims, frame)
        self._clear(victims)
        self._push_free(victims)
        e = np.zeros(0, np.int64)
        return Allocation(e, tiles, victims, last, self.layers)

    def weigh_by(self, priority: np.ndarray | None, *, loops: LedgerLoops | None = None) -> None:
        """Weigh idle time by `priority[texture id]` when picking victims (an array the caller owns
        and may change; every entry > 0; None: unweighed). `loops`: the compiled passes (victims among
        them; `touch.DeciderLoops.ledger`), or None: numpy, the same victims and state."""
        self.victims.weigh_by(priority, loops)

    def _pick_victims(self, frame: int, count: int) -> np.ndarray:
        return self.victims.pick(frame, count, self.state, self.pinned, self.last_used, self.tex, self.level)

    # ---- state changes --------------------------------------------------------------------------
    def _slots(self, slots: np.ndarray | int, states: tuple[int, ...], what: str) -> np.ndarray:
        s = np.asarray(slots, np.int64).ravel()
        if s.size == 0:
            return s
        if s.min() < 0 or s.max() >= self.capacity:
            raise ValueError(f"{self.name}: {what} slot out of range 0..{self.capacity - 1}: {s.min()}..{s.max()}")
        st = self.state[s]
        ok = st == states[0]
        for other in states[1:]:
            ok |= st == other
        if not ok.all():
            bad = int(s[~ok][0])
            now = CacheSlotState(int(self.state[bad])).name
            raise ValueError(f"{self.name}: cannot {what} slot {bad} in state {now}")
        return s

    def mark_resident(self, slots: np.ndarray | int, frame: int) -> None:
        """LOADING -> RESIDENT (its upload was issued); counts as a use at `frame` (a frame's arrivals
        in every pool at once: `PoolLedgers.mark_resident`)."""
        s = self._slots(slots, (_LOADING,), "mark resident")
        self.state[s] = _RESIDENT
        self.last_used[s] = np.maximum(self.last_used[s], frame)

    def free(self, slots: np.ndarray | int) -> None:
        """LOADING -> FREE: a load that failed or was cancelled (nothing was written into the slot)."""
        s = np.unique(self._slots(slots, (_LOADING,), "free"))
        self._clear(s)
        self._push_free(s)

    def free_loads(self, slots: np.ndarray, tiles: np.ndarray) -> None:
        """Free the slots of loads that ended without an upload, skipping any slot a resize removed or
        re-let to another tile since (its load record is stale)."""
        cs, tiles = np.asarray(slots, np.int64), np.asarray(tiles, np.int64)
        live = (cs >= 0) & (cs < self.capacity)
        live[live] = (self.tile[cs[live]] == tiles[live]) & (self.state[cs[live]] == _LOADING)
        self.free(cs[live])

    def touch(self, slots: np.ndarray, frame: int) -> None:
        """Record a use at `frame` of every listed slot (-1 entries ignored; a free slot's use is
        overwritten when it is allocated)."""
        s = np.asarray(slots, np.int64).ravel()
        s = s[(s >= 0) & (s < self.capacity)]
        self.last_used[s] = frame

    def pin(self, slots: np.ndarray | int) -> None:
        """Never evict these slots (the coarsest levels, or an all-resident reference)."""
        s = self._slots(slots, (_LOADING, _RESIDENT), "pin")
        self.pinned[s] = True

    def unpin(self, slots: np.ndarray | int) -> None:
        s = self._slots(slots, (_LOADING, _RESIDENT), "unpin")
        self.pinned[s] = False
        self.victims.forget()  # an unpinned slot may be a better victim than the spares

    def release_texture(self, tex: int, frame: int) -> tuple[np.ndarray, np.ndarray]:
        """Drop every slot of texture `tex`; returns (tiles, slots) that were LOADING: cancel those
        loads. Slots that held tiles are not overwritten before frame + frames_in_flight."""
        s = ((self.tex == tex) & (self.state != _FREE)).nonzero()[0]
        loading = s[self.state[s] == _LOADING]
        resident = s[self.state[s] == _RESIDENT]
        out = (self.tile[loading].copy(), loading.copy())
        self.writable_at[resident] = np.maximum(self.writable_at[resident], frame + self.frames_in_flight)
        self._add_gates(resident, frame)
        self._clear(s)
        self._push_free(s)
        return out

    def _clear(self, s: np.ndarray) -> None:
        self.state[s] = _FREE
        self.tile[s] = -1
        self.tex[s] = -1
        self.pinned[s] = False

    def _push_free(self, s: np.ndarray) -> None:
        """Put slots on the free stack, which stays sorted (the lowest free slot on top): the new
        slots are merged in (linear in the stack), not the whole stack sorted again (a pool of 30k
        slots cost half a millisecond a frame that freed a few loads)."""
        if s.size:
            add = np.sort(s)
            asc = self._free[::-1]
            self._free = np.insert(asc, np.searchsorted(asc, add), add)[::-1]

    # ---- resizing -------------------------------------------------------------------------------
    def check_capacity(self, capacity: int) -> None:
        """ValueError unless `capacity` is a positive number of whole layers."""
        cells = self.cells
        if not isinstance(capacity, int | np.integer) or capacity < cells or capacity % cells:
            raise ValueError(f"capacity must be a positive multiple of {cells} slots (whole layers), got {capacity!r}")

    def grow(self, capacity: int) -> ResizeResult:
        """Add free layers up to `capacity` slots (no overwrite gates: a fresh array). Every held slot
        keeps its cell and layer but is renumbered for the new layer count (returned as moves)."""
        self.check_capacity(capacity)
        self.victims.forget()  # slots are renumbered
        if capacity > 1 << SLOT_BITS:
            raise ValueError(f"{self.name}: {capacity} slots; a pool holds at most {1 << SLOT_BITS}")
        old, extra = self.capacity, capacity - self.capacity
        assert extra >= 0, "grow() cannot shrink; plan_shrink() and apply_shrink() do"
        old_layers, new_layers = old // self.cells, capacity // self.cells
        where = np.arange(old, dtype=np.int64) // max(old_layers, 1) * new_layers + np.arange(old) % max(old_layers, 1)

        def ext(a: np.ndarray, fill: object) -> np.ndarray:
            out = np.full(capacity, fill, a.dtype)
            out[where] = a
            return out

        held = (self.state != _FREE).nonzero()[0]
        self.state = ext(self.state, _FREE)
        self.tile = ext(self.tile, -1)
        self.tex = ext(self.tex, -1)
        self.level = ext(self.level, 0)
        self.last_used = ext(self.last_used, NEVER)
        self.pinned = ext(self.pinned, False)
        self.writable_at = ext(self.writable_at, NEVER)
        self.capacity = capacity
        self._free = (self.state == _FREE).nonzero()[0][::-1].copy()
        changed = where[held] != held
        e = np.zeros(0, np.int64)
        return ResizeResult(held[changed], where[held][changed], e, e, e)

    def plan_shrink(self, capacity: int) -> ShrinkPlan:
        """Decide a shrink to `capacity` slots without changing anything.

        Keeps every pinned tile, every loading slot in the kept layers and then the most recently used
        resident tiles (coarser levels first among equal uses); survivors from removed layers move
        into free slots of the kept layers. BudgetError when the pinned tiles (plus the loading slots
        of the kept layers) do not fit. The plan's slots are numbered for the current layer count.
        """
        self.check_capacity(capacity)
        assert capacity < self.capacity, "plan_shrink() needs a smaller capacity"
        idx = np.arange(self.capacity)
        kept = idx % self.layers < capacity // self.cells  # the first layers of every cell
        resident = self.state == _RESIDENT
        loading = self.state == _LOADING
        must = (self.pinned & resident) | (loading & kept)
        n_must = int(np.count_nonzero(must))
        if n_must > capacity:
            n_pinned = int(np.count_nonzero(self.pinned & resident))
            raise BudgetError(
                f"{self.name}: cannot shrink to {capacity} slots: {n_pinned} pinned tiles plus "
                f"{n_must - n_pinned} loading slots in the kept layers need {n_must}"
            )
        optional = (resident & ~must).nonzero()[0]
        room = capacity - n_must
        if optional.size > room:
            key = self.last_used[optional] * 64 + self.level[optional]  # most recent first; then coarser
            order = np.lexsort((optional, -key))
            survivors, dropped = optional[order[:room]], optional[order[room:]]
        else:
            survivors, dropped = optional, np.zeros(0, np.int64)
        survivors = np.concatenate([must.nonzero()[0], survivors])
        cancelled = (loading & ~kept).nonzero()[0]
        movers = np.sort(survivors[~kept[survivors]])
        keep_mask = np.zeros(self.capacity, bool)
        keep_mask[survivors] = True
        targets = (kept & ~keep_mask).nonzero()[0][: movers.size]
        assert targets.size == movers.size, "survivors exceed the new capacity"
        return ShrinkPlan(
            capacity=capacity,
            survivors=survivors,
            dropped=dropped,
            cancelled=cancelled,
            moved_from=movers,
            moved_to=targets,
        )

    def apply_shrink(self, plan: ShrinkPlan) -> ResizeResult:
        """Carry out a plan made by `plan_shrink` on this ledger (the GPU copies are the pool's). The
        result's moves map every surviving slot's old number to its number in the smaller pool."""
        capacity, movers, targets = plan.capacity, plan.moved_from, plan.moved_to
        self.victims.forget()  # slots are renumbered
        old_layers, new_layers = self.layers, capacity // self.cells
        evicted_tiles = self.tile[plan.dropped].copy()
        cancelled_tiles, cancelled_slots = self.tile[plan.cancelled].copy(), plan.cancelled.copy()
        self._clear(np.concatenate([plan.dropped, plan.cancelled]).astype(np.int64))
        for arr in (self.state, self.tile, self.tex, self.level, self.last_used, self.pinned):
            arr[targets] = arr[movers]
        # where each old slot's content ends up (old numbering), then its number in the new pool
        dest = np.arange(self.capacity, dtype=np.int64)
        dest[movers] = targets
        kept = (np.arange(self.capacity) % old_layers < new_layers).nonzero()[0]
        renamed = kept // old_layers * new_layers + kept % old_layers
        for name in ("state", "tile", "tex", "level", "last_used", "pinned", "writable_at"):
            a = getattr(self, name)
            out = np.empty(capacity, a.dtype)
            out[renamed] = a[kept]
            setattr(self, name, out)
        number = np.full(self.capacity, -1, np.int64)
        number[kept] = renamed
        self.capacity = capacity
        free = (self.state == _FREE).nonzero()[0]
        self._clear(free)
        self._free = free[::-1].copy()
        stay = np.setdiff1d(plan.survivors, movers)
        old = np.concatenate([stay, movers]).astype(np.int64)
        new = number[dest[old]]
        changed = new != old
        return ResizeResult(old[changed], new[changed], evicted_tiles, cancelled_tiles, cancelled_slots)

    def _gate(self, slots: np.ndarray, frame: int) -> None:
        """Slots whose tiles leave them at `frame`: not overwritten before frame + frames_in_flight."""
        self.writable_at[slots] = frame + self.frames_in_flight
        self._add_gates(slots, frame)

    def _add_gates(self, slots: np.ndarray, frame: int) -> None:
        self._gated = np.concatenate([self._gated, slots])
        self._gated_until = np.concatenate([self._gated_until, np.full(slots.size, frame + self.frames_in_flight)])

    def open_gates_before(self, done_frame: int, frame: int) -> int:
        """The GPU has finished every draw of frames up to `done_frame` (a fence behind them signalled):
        slots whose tiles left them at a frame E <= done_frame + 1 are writable from `frame` on (no
        draw still in flight was issued before E). Costs a search of the gates and a pass over those
        that open or passed. Returns how many gates opened early."""
        if self._gated.size == 0:
            return 0
        early_until = done_frame + 1 + self.frames_in_flight  # the gate of a slot left at done_frame + 1
        # Entries are in gating order, so those whose gate opens now or passed are a prefix; a slot
        # gated again later has a later entry too (its gate is its latest one)
        cut = int(np.searchsorted(self._gated_until, max(frame, early_until), "right"))
        if cut == 0:
            return 0
        head = self._gated[:cut]
        self._gated, self._gated_until = self._gated[cut:], self._gated_until[cut:]
        head = head[head < self.capacity]
        gate = self.writable_at[head]
        early = head[(gate > frame) & (gate <= early_until)]
        self.writable_at[early] = frame
        return int(sorted_unique(early).size)

    def open_gates(self) -> None:
        """Every slot writable now: the pool moved to a fresh array no draw in flight samples."""
        self.writable_at[:] = NEVER
        self._gated, self._gated_until = np.zeros(0, np.int64), np.zeros(0, np.int64)

    def check(self) -> None:
        """Assert internal consistency (tests and debugging)."""
        used = self.state != _FREE
        assert self.state.size == self.capacity and self.capacity % self.cells == 0, "capacity is not whole layers"
        assert np.unique(self._free).size == self._free.size, "a slot is free twice"
        assert set(self._free.tolist()) == set((~used).nonzero()[0].tolist()), "free list disagrees with states"
        assert (self.tile[used] >= 0).all() and (self.tile[~used] == -1).all()
        assert not (self.pinned & ~used).any()
        t = self.tile[used]
        assert np.unique(t).size == t.size, "a tile holds two slots"
