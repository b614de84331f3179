"""The residency core: what is resident, where, and what to load next. No GL, no threads.

`Residency` owns every piece of state that decides residency: the tile id space (`tiles.TileSpace`),
the page tables as arrays (`page_table.PageTables`), one `slots.SlotLedger` per cache pool, the
request scheduler, the feedback reducer, the texture sets and priorities (`texture_sets`), the
budget's mip-bias steps and the latency and totals counters. Nothing else changes them. The movers
(cache texture arrays, staging ring, I/O threads, uploader, feedback buffers) carry out its decisions
and hand back records (`records`); the streamer moves those between them. Its verbs, in the order of a frame:

- `begin_frame` advances the frame counter;
- `observe(feedback)` reduces the newest feedback to wanted pages (texture sets' lead pages mapped onto
  their members, the bias applied by priority), steps the bias and touches every slot they sample;
- `apply(drained=...)` and `apply(uploaded=...)` fold the I/O results and the issued uploads in:
  failed loads back off and free their slots; uploaded tiles become resident in ledger and tables;
- `orders(free ring slots, cancel_stale)` picks this frame's loads, reserves their cache slots
  (evicting least-recently-used tiles no frame in flight samples) as few runs of consecutive slots
  as possible, and keeps each pool's reserve of free slots;
- `plan(budget)` shares the budget among the pools; `apply_resize` folds each pool's resize in.

It is driven entirely through these verbs and records, so a whole frame runs on the CPU with synthetic
feedback (tests/runtime/test_residency.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..config import StreamerConfig
from ..errors import BudgetError
from ..pack.format import PackHeader
from .budget import BudgetManager
from .budget_advice import layers_bytes, minimum_budget, pinned_tiles
from .feedback_reduce import CompactFeedback, FeedbackReducer, Wanted, same_feedback, snapshot_feedback, unique_counts
from .int_sets import distinct
from .page_table import PageTables, TexturePages
from .pool_ledgers import PoolLedgers
from .pool_sizing import PoolDemand, plan_capacities
from .records import Drained, LoadRecords, Uploaded
from .requests import RequestScheduler
from .slots import MAX_POOLS, RUN_DTYPE, Allocation, ResizeResult, SlotGeometry, SlotLedger
from .texture_sets import Priorities, SetTable, bias_levels, coarsen_by
from .tiles import MAX_TEXTURES, TileRange, TileSpace
from .touch import DeciderLoops, SampledSlots

__all__ = ["Completeness", "Orders", "POOL_RUN_DTYPE", "Residency", "StreamTotals"]

log = logging.getLogger(__name__)

LATENCY_SAMPLES = 4096  # uploads whose request-to-residency latency the percentiles cover

#: A run of consecutive cache slots of one pool, as `Orders.runs` lists them.
POOL_RUN_DTYPE = np.dtype([("pool", np.int64), *((n, RUN_DTYPE[n]) for n in RUN_DTYPE.names or ())])


@dataclass(frozen=True)
class StreamTotals:
    """Running totals since the streamer started."""

    uploads: int  # tiles uploaded into the cache
    upload_bytes: int
    evicted: int  # tiles evicted
    failed: int  # failed loads (a tile failing again counts again)
    requested: int  # loads handed to the I/O threads
    cancelled: int  # queued loads dropped because nothing wanted them any more


@dataclass(frozen=True)
class Evictions:
    """Tiles that lost their cache slot this frame, and frames since each was last used."""

    tiles: np.ndarray
    age: np.ndarray

    @classmethod
    def empty(cls) -> Evictions:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))

    def __len__(self) -> int:
        return int(self.tiles.size)


@dataclass(frozen=True)
class Orders:
    """Loads to start this frame (`Residency.orders`): tile ids in priority order with the pool and
    the cache slot reserved for each, those slots as runs of consecutive slots per pool, the tiles
    evicted to make room, and the loads cancelled because nothing wanted them any more."""

    tiles: np.ndarray
    pool: np.ndarray
    cache_slot: np.ndarray
    evicted: Evictions
    cancelled: int
    select_ms: float = 0.0  # wall ms of the scheduler's step (the rest of `orders` reserves slots)
    allocations: tuple[tuple[int, Allocation], ...] = ()  # (pool, what its ledger handed out)

    def __len__(self) -> int:
        return int(self.tiles.size)

    @property
    def runs(self) -> np.ndarray:
        """The reserved slots as runs of consecutive slots per pool (`POOL_RUN_DTYPE`; worked out
        when asked: the frame itself does not need them)."""
        runs = [(p, a.runs) for p, a in self.allocations]
        out = np.zeros(sum(r.size for _, r in runs), POOL_RUN_DTYPE)
        out["pool"] = np.repeat([p for p, _ in runs], [r.size for _, r in runs]).astype(np.int64)
        for name in RUN_DTYPE.names or ():
            out[name] = np.concatenate([r[name] for _, r in runs] or [np.zeros(0, np.int64)])
        return out


@dataclass(frozen=True)
class Completeness:
    """How much of what the newest feedback wants is resident at the level it wants.

    Attributes
    ----------
    frame : int
        The frame the figures were taken at.
    wanted_pages, resident_pages : int
        Pages the newest feedback wants (the budget's mip bias applied: what streaming aims for),
        and of those, resident at exactly that level.
    overall : float
        ``resident_pages / wanted_pages``; 1.0 when nothing is wanted (nothing is missing).
    per_texture : dict[int, float]
        The same share per texture id, for every open texture (1.0 for one nothing wants).
    """

    frame: int
    wanted_pages: int
    resident_pages: int
    overall: float
    per_texture: dict[int, float] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """True when every wanted page is resident at its wanted level."""
        return self.resident_pages == self.wanted_pages


class Residency:
    """The residency state of one streamer and the verbs that change it (see the module docstring).

    Parameters
    ----------
    config
        Streaming configuration (caps, pinned levels, frames in flight, cancel delay).
    budget
        The VRAM budget: only its mip-bias controller is stepped here (allocations are the movers';
        their sizes are read for the smallest budget a `BudgetError` names).
    loops
        Compiled twins of the per-frame loops (`compiled_loops.decider_loops`: the feedback count,
        sets, touch and the scheduler's passes), or None: numpy, the same results.
    """

    def __init__(self, config: StreamerConfig, budget: BudgetManager, *, loops: DeciderLoops | None = None) -> None:
        self.config, self.budget = config, budget
        self.frame = 0
        self.space = TileSpace()
        self.tables = PageTables(self.space)
        self.reducer = FeedbackReducer(self.space, feedback_loop=loops and loops.feedback_pages)
        self.sets = SetTable(self.space)
        self._sampled = SampledSlots(self.space, self.tables, walk_loop=loops and loops.sample_slots)  # `_touch`
        self._ledger_loops = loops and loops.ledger  # every ledger's (`attach`)
        self.priority = Priorities()
        self._loading: Callable[[np.ndarray], np.ndarray] = lambda ids: np.zeros(ids.size, bool)
        self.ring_tile_bytes = 0  # the staging ring's slot size (set_loading)
        self.scheduler = RequestScheduler(
            config, self.space, self.tables, lambda ids: self._loading(ids), priority=self.priority.values,
            loops=loops and loops.scheduler,
        )  # fmt: skip
        self.ledgers: list[SlotLedger | None] = [None] * MAX_POOLS
        self._pool_ledgers = PoolLedgers(self.ledgers, loops and loops.ledger)  # a frame's arrivals and uses
        self.geometry: list[SlotGeometry | None] = [None] * MAX_POOLS
        self.pool_of = np.full(MAX_TEXTURES, -1, np.int64)  # pool index of each texture id
        self.level_pins = [0] * MAX_POOLS  # per pool: slots pinned for textures' coarsest levels
        self.headers: dict[int, PackHeader] = {}
        self.failed_tile = np.zeros(self.space.capacity, bool)  # a load of the tile failed at least once
        self.failed_loads = np.zeros(MAX_TEXTURES, np.int64)  # failed load attempts per texture
        self.space.add_listener(self._grow)
        self.sampled = Wanted.empty()  # newest feedback's pages without the bias (what draws sample)
        self.wanted = Wanted.empty()  # this frame's wanted pages, bias applied (what gets loaded)
        self.needed = Wanted.empty()  # the newest feedback's wanted pages: touched every frame
        self._totals = dict.fromkeys(("uploads", "upload_bytes", "evicted", "failed", "requested", "cancelled"), 0)
        self._latencies: deque[int] = deque(maxlen=LATENCY_SAMPLES)
        self._feedback_frames: deque[int] = deque(maxlen=config.cancel_after_frames)  # frames with fresh feedback
        # the newest feedback reduced, for the id space and sets it was reduced against: feedback
        # equal to it (a still view) skips the reduction (`observe`)
        self._reduced: tuple[tuple[int, int], Sequence[np.ndarray | CompactFeedback], Wanted] | None = None

    def _grow(self, capacity: int) -> None:
        self.failed_tile = np.concatenate([self.failed_tile, np.zeros(capacity - self.failed_tile.size, bool)])

    def set_loading(self, loading: Callable[[np.ndarray], np.ndarray], ring_tile_bytes: int = 0) -> None:
        """The uploader's answers: the mask of tile ids that have a load in flight, and the bytes of
        its staging-ring slots (the ring a smaller budget would still need, for `BudgetError`s)."""
        self._loading, self.ring_tile_bytes = loading, ring_tile_bytes

    # ---- textures -------------------------------------------------------------------------------
    def pinned_tiles(self, h: PackHeader) -> int:
        """Tiles of a pack's pinned levels."""
        return pinned_tiles(h, self.config.pinned_levels)

    def register(self, tex: int, h: PackHeader) -> TileRange:
        """Give texture `tex` its tile ids (undo with `unregister` if opening fails before `attach`)."""
        return self.space.register(tex, h)

    def unregister(self, tex: int) -> None:
        self.space.unregister(tex)

    def attach(self, tex: int, h: PackHeader, pool: int, ledger: SlotLedger, geometry: SlotGeometry) -> None:
        """Texture `tex` (registered) streams into pool `pool` through `ledger`."""
        if self.ledgers[pool] is None:
            self.ledgers[pool], self.geometry[pool] = ledger, geometry
        assert self.ledgers[pool] is ledger, "one ledger per pool"
        ledger.weigh_by(self.priority.values, loops=self._ledger_loops)
        self.pool_of[tex] = pool
        self.headers[tex] = h
        self.tables.add_texture(tex, self.config.pinned_levels)
        rng = self.space.ranges[tex]
        self.failed_tile[rng.start : rng.stop] = False
        self.failed_loads[tex] = 0

    def table_view(self, tex: int) -> TexturePages:
        """Texture `tex`'s page table as a read-only view."""
        return TexturePages(self.tables, tex)

    def textures_of(self, pool: int) -> list[int]:
        return (self.pool_of == pool).nonzero()[0].tolist()

    def detach(self, tex: int, cancelled: LoadRecords) -> bool:
        """Texture `tex` closed: its loads (`cancelled`) end, its slots free once the frames in flight
        no longer sample them, its ids and table go. True when its pool has no texture left."""
        pool = int(self.pool_of[tex])
        ledger = self.ledgers[pool]
        assert ledger is not None
        self.free_loads(cancelled)
        if self.tables.resident_count[tex]:
            self.level_pins[pool] -= self.pinned_tiles(self.headers[tex])
        ledger.release_texture(tex, self.frame)
        rng = self.space.ranges[tex]
        self.scheduler.forget(rng.start, rng.stop)
        self.sets.forget_texture(tex)
        self.priority.reset(tex)
        self.tables.remove_texture(tex)
        self.space.unregister(tex)
        self.pool_of[tex] = -1
        del self.headers[tex]
        self.sampled = self.sampled.select(self.space.is_tile(self.sampled.ids))
        self.needed = self.needed.select(self.space.is_tile(self.needed.ids))
        if pool in self.pool_of:
            return False
        self.ledgers[pool] = self.geometry[pool] = None
        self.level_pins[pool] = 0
        return True

    # ---- blocking loads (open's pinned levels, all-resident references) ---------------------------
    def reserve_now(self, tex: int, ids: np.ndarray, *, pin: bool, what: str) -> tuple[np.ndarray, Evictions]:
        """Cache slots for `ids` of texture `tex` now, or BudgetError changing nothing but evictions."""
        ledger = self._ledger_of(tex)
        alloc = ledger.allocate(self.frame, ids, np.full(ids.size, tex), self.space.level[ids])
        evicted = self._evicted(alloc.evicted_tiles, alloc.evicted_last_used)
        if np.any(alloc.slots < 0):
            got = alloc.slots[alloc.slots >= 0]
            ledger.free(got)
            raise BudgetError(f"{what}: {ids.size} tiles need cache slots and the tile cache has {got.size} to give")
        if pin:
            ledger.pin(alloc.slots)
        return alloc.slots, evicted

    def loaded_now(self, tex: int, ids: np.ndarray, slots: np.ndarray, *, pinned_levels: bool = False) -> None:
        """A blocking load of `ids` into `slots` succeeded: resident in the ledger and the tables."""
        self._ledger_of(tex).mark_resident(slots, self.frame)
        self.tables.set_resident(ids, slots)
        if pinned_levels:
            self.level_pins[int(self.pool_of[tex])] += int(ids.size)

    def abort_now(self, tex: int, slots: np.ndarray) -> None:
        """A blocking load failed: its slots are free again and nothing became resident."""
        self._ledger_of(tex).free(slots)

    def pinned_level_ids(self, tex: int) -> np.ndarray:
        first = self.tables.first_pinned[tex]
        return self.space.tile_ids(tex, range(int(first), self.headers[tex].level_count))

    def all_resident_plan(self, tex: int) -> tuple[np.ndarray, np.ndarray]:
        """(tile ids of `tex` not resident, slots of its resident tiles that are not pinned yet)."""
        ids = self.space.tile_ids(tex)
        resident = self.tables.is_resident(ids)
        ledger = self._ledger_of(tex)
        held = self.tables.own[ids[resident]].astype(np.int64)
        return ids[~resident], held[~ledger.pinned[held]]

    def check_room(self, tex: int, ids: np.ndarray, what: str) -> None:
        """BudgetError unless texture `tex`'s pool can take `ids` without evicting any of its own tiles;
        it names the smallest budget holding all of `tex` besides the other textures' pinned levels."""
        ledger = self._ledger_of(tex)
        others = ledger.evictable_mask(self.frame) & (ledger.tex != tex)
        if ids.size > ledger.free_count + int(np.count_nonzero(others)):
            h, bm = self.headers[tex], self.budget
            fixed = bm.reserved("feedback") + bm.reserved("page-tables") + self.pinned_layers_bytes(full=tex)
            tile_bytes = max(h.tile_raw_size, self.ring_tile_bytes)
            raise BudgetError(
                f"{what}: all {h.tile_count} tiles need {h.tile_count * h.tile_raw_size / 2**20:.1f} MiB of "
                f"cache and the tile cache holds {ledger.capacity} slots",
                minimum_bytes=minimum_budget(fixed, ring_mb=self.config.ring_mb, tile_bytes=tile_bytes),
            )

    # ---- budget advice: the smallest budget that fits, for BudgetError messages --------------------
    def pinned_layers_bytes(
        self, new: tuple[int, SlotGeometry, PackHeader] | None = None, *, full: int = -1, levels: int | None = None
    ) -> int:
        """Bytes of the whole layers every pool's pinned tiles take (a pool holds one layer at least).

        `new` adds a texture: (the index of the pool it would join, -1 for a new pool; that pool's
        geometry; its header). Texture id `full` counts all its tiles, not only its pinned ones;
        `levels` pinned levels are counted instead of the configured number.
        """
        levels = self.config.pinned_levels if levels is None else levels
        pools: dict[int, tuple[SlotGeometry, int]] = {}
        for p, g in enumerate(self.geometry):
            if g is not None:
                hs = {t: self.headers[t] for t in self.textures_of(p)}
                pools[p] = (g, sum(h.tile_count if t == full else pinned_tiles(h, levels) for t, h in hs.items()))
        if new is not None:
            p, g, h = new
            g, tiles = pools.get(p, (g, 0))
            pools[p] = (g, tiles + pinned_tiles(h, levels))
        return layers_bytes(pools.values())

    def open_minimum(self, new: tuple[int, SlotGeometry, PackHeader], page_bytes: int, levels: int | None) -> int:
        """The smallest budget in which the open textures and `new` (see `pinned_layers_bytes`) fit:
        feedback, `page_bytes` of page tables, the pinned levels' layers of every pool and the ring."""
        fixed = self.budget.reserved("feedback") + page_bytes + self.pinned_layers_bytes(new, levels=levels)
        tile_bytes = max(new[2].tile_raw_size, self.ring_tile_bytes)
        return minimum_budget(fixed, ring_mb=self.config.ring_mb, tile_bytes=tile_bytes)

    def _ledger_of(self, tex: int) -> SlotLedger:
        ledger = self.ledgers[int(self.pool_of[tex])]
        assert ledger is not None, f"texture {tex} has no pool"
        return ledger

    # ---- the frame ------------------------------------------------------------------------------
    def begin_frame(self) -> int:
        self.frame += 1
        self.wanted = Wanted.empty()
        return self.frame

    def observe(self, feedback: Sequence[np.ndarray | CompactFeedback], gpu_done: int | None = None) -> Wanted:
        """Fold in the feedback read this frame (raw page ids or buffers compacted on the GPU, possibly
        none): this frame's wanted pages, bias applied. Until newer feedback arrives, the newest wanted
        pages are assumed to be needed still and their slots are touched every frame. Under a bias,
        finer tiles the draws still sample are not touched: they age out and make room for what the
        budget can hold (a frame in flight never loses a tile it samples: the slots' overwrite gate).
        `gpu_done`: the newest frame whose draws the GPU has finished (a fence behind them signalled),
        if known: slots evicted after it are writable at once (`open_gates`)."""
        self.open_gates(gpu_done)
        wanted = Wanted.empty()
        if feedback and self.headers:
            stamp = (self.space.generation, self.sets.generation)
            last = self._reduced
            if last is None or last[0] != stamp or not same_feedback(last[1], feedback):
                sets, reducer = self.sets, self.reducer
                self.sampled = reducer.wanted_pages(feedback, sets.follow, sets.expand, self.pool_of, MAX_POOLS)
                snapshot = snapshot_feedback(feedback)  # None: too large to keep, reduced every time
                self._reduced = None if snapshot is None else (stamp, snapshot, self.sampled)
            else:  # the same feedback as last time, against the same ids and sets: the same pages
                self.sampled = last[2]
            bias = self.budget.bias
            wanted = self.coarsen(self.sampled, bias)
            self._step_bias(wanted, lambda: self.coarsen(self.sampled, bias - 1, pressure=bias > 0))
            self.needed = wanted
            self._feedback_frames.append(self.frame)
        self.wanted = wanted
        self._touch(self.needed)
        return wanted

    def open_gates(self, gpu_done: int | None) -> None:
        """The GPU finished the draws up to frame `gpu_done` (None: unknown): the slots evicted after
        it are writable from now on (`SlotLedger.open_gates_before`)."""
        for ledger in [g for g in self.ledgers if g is not None] if gpu_done is not None else []:
            ledger.open_gates_before(gpu_done, self.frame)

    def coarsen(self, wanted: Wanted, bias: float, *, pressure: bool | None = None) -> Wanted:
        """`wanted` coarsened by the mip `bias`, each texture by its priority's share of it
        (`texture_sets.bias_levels`); `pressure` (default: bias > 0) says whether a bias is in force."""
        if (bias > 0 if pressure is None else pressure) and len(wanted):
            if self.priority.uniform:  # every page by floor(bias) (bias_levels' answer, without its passes)
                return self.reducer.coarsen(wanted, max(0, math.floor(bias + 1e-9)))
            levels = bias_levels(self.space, self.priority.values, wanted.ids, bias)
            return coarsen_by(self.space, wanted, levels)
        return wanted

    def apply(self, *, drained: Drained | None = None, uploaded: Uploaded | None = None) -> LoadRecords:
        """Fold in what the movers did: reads that failed (their slots freed, their tiles backed off;
        returned) and uploads issued (resident from now on)."""
        failed = LoadRecords.empty()
        if drained is not None and len(drained.failed):
            failed = drained.failed
            self.free_loads(failed)
            self.scheduler.mark_failed(failed.tiles, self.frame)
            self.failed_tile[failed.tiles] = True
            np.add.at(self.failed_loads, failed.tex, 1)
            self._totals["failed"] += len(failed)
            log.warning("%d tile loads failed, first: %s", len(failed), drained.reasons[0])
        if uploaded is not None and len(uploaded.loads):
            loads = uploaded.loads
            self._pool_ledgers.mark_resident(loads.cache_slot, loads.pool, self.frame)
            self.tables.set_resident(loads.tiles, loads.cache_slot)
            self.scheduler.mark_resident(loads.tiles)
            self._latencies.extend(uploaded.latency_frames.tolist())
            self._totals["uploads"] += len(loads)
            self._totals["upload_bytes"] += uploaded.nbytes
        return failed

    def orders(
        self, free_ring_slots: int, cancel_stale: Callable[[np.ndarray, int], LoadRecords], *, widen: bool = False
    ) -> Orders:
        """This frame's loads, at most `free_ring_slots`, each with a reserved cache slot (`widen`: a new
        view, `RequestScheduler.update`). Reads nobody wants any more are cancelled through
        `cancel_stale(last_wanted, since)` (the uploader's): those of tiles in none of the last
        cancel_after_frames feedback readbacks (counted in readbacks, not frames: on a real GPU feedback
        may skip frames, and a load must outlive that gap). Prefetch takes free slots only, and not the
        reserve kept for demand: evicting for it would trade tiles the screen used a few frames ago for
        tiles it may never use."""
        t0 = time.perf_counter()
        requests = self.scheduler.update(self.frame, self.wanted, free_ring_slots, widen=widen)
        cancelled = requests.cancelled
        if len(self._feedback_frames) == self._feedback_frames.maxlen:
            stale = cancel_stale(self.scheduler.last_wanted, self._feedback_frames[0])
            if len(stale):
                self.free_loads(stale)
                cancelled += len(stale)
        select_ms = (time.perf_counter() - t0) * 1e3
        self._totals["cancelled"] += cancelled
        ids, prefetch = requests.ids, requests.prefetch
        if ids.size == 0:  # nothing to reserve (and a still view keeps its tiles: no keep_free)
            z = np.zeros(0, np.int64)
            return Orders(z, z, z, Evictions.empty(), cancelled, select_ms)
        freed: list[Allocation] = []  # what each ledger evicted
        allocations: list[tuple[int, Allocation]] = []
        slots = np.full(ids.size, -1, np.int64)
        keep = np.ones(ids.size, bool)
        tex = self.space.tex[ids].astype(np.int64)
        pool_of = self.pool_of[tex]
        pools = distinct(pool_of)
        level = self.space.level[ids]
        for p in pools:
            ledger = self.ledgers[p]
            assert ledger is not None
            m = (pool_of == p).nonzero()[0] if len(pools) > 1 else np.arange(ids.size)
            pre = m[prefetch[m]]
            allowed = max(0, ledger.free_count - self.reserve(p) - int(m.size - pre.size))
            if pre.size > allowed:
                keep[pre[allowed:]] = False
                m = m[keep[m]]
            alloc = ledger.allocate(self.frame, ids[m], tex[m], level[m])
            freed.append(alloc)
            slots[m] = alloc.slots
            allocations.append((p, alloc))
        go = keep & (slots >= 0)
        for p, ledger in enumerate(self.ledgers):  # slots past their gate for the coming frames
            if ledger is not None:  # (only while streaming: a still view keeps its tiles)
                freed.append(ledger.keep_free(self.frame, self.reserve(p)))
        self._totals["requested"] += int(np.count_nonzero(go))
        return Orders(
            tiles=ids[go],
            pool=pool_of[go],
            cache_slot=slots[go],
            evicted=self._evicted_all(freed),
            cancelled=cancelled,
            select_ms=select_ms,
            allocations=tuple(allocations),
        )

    def _evicted_all(self, allocations: list[Allocation]) -> Evictions:
        """The tiles these allocations evicted leave the page tables (one call for all pools)."""
        parts = [a for a in allocations if a.evicted_tiles.size] or [Allocation.empty()]
        if len(parts) == 1:
            return self._evicted(parts[0].evicted_tiles, parts[0].evicted_last_used)
        return self._evicted(
            *(np.concatenate([getattr(a, f) for a in parts]) for f in ("evicted_tiles", "evicted_last_used"))
        )

    def missing_pages(self, wanted: Wanted) -> int:
        """Pages of `wanted` not resident at their level."""
        return int(np.count_nonzero(~self.tables.is_resident(wanted.ids))) if len(wanted) else 0

    # ---- bookkeeping shared by the verbs ----------------------------------------------------------
    def reserve(self, pool: int) -> int:
        """Free slots kept ahead of demand in pool `pool` (prefetch never takes them)."""
        ledger = self.ledgers[pool]
        assert ledger is not None
        return min(ledger.capacity // 16, self.config.upload_tiles_per_frame)

    def free_loads(self, loads: LoadRecords) -> None:
        """Give back the cache slots of loads that ended without an upload (a slot a resize removed
        or re-let is left alone)."""
        for p in distinct(loads.pool):
            ledger = self.ledgers[p] if 0 <= p < MAX_POOLS else None
            if ledger is not None:
                m = loads.pool == p
                ledger.free_loads(loads.cache_slot[m], loads.tiles[m])

    def _evicted(self, tiles: np.ndarray, last_used: np.ndarray) -> Evictions:
        if tiles.size == 0:
            return Evictions.empty()
        self.tables.set_absent(tiles)
        self._totals["evicted"] += int(tiles.size)
        return Evictions(tiles, self.frame - last_used)

    def _touch(self, wanted: Wanted) -> None:
        """Record a use of every slot `wanted` samples, and its parent's (trilinear reads both)."""
        if len(wanted) and self.headers:
            pools = [p for p, ledger in enumerate(self.ledgers) if ledger is not None]
            found = self._sampled.grouped(wanted.ids, self.pool_of, pools)
            self._pool_ledgers.touch(found.slots, found.counts, self.frame)

    def stream_capacity(self, pool: int) -> int:
        """Slots a pool has for streamed tiles (those pinned for the coarsest levels do not count;
        make_all_resident's pins do)."""
        ledger = self.ledgers[pool]
        assert ledger is not None
        return max(1, ledger.capacity - self.level_pins[pool])

    def pressure(self, wanted: Wanted | None = None) -> dict[int, tuple[int, int]]:
        """Per pool index: (working set, capacity) of `wanted` (default this frame's): the wanted tiles
        plus their parents (trilinear samples both), pinned levels excluded."""
        wanted = self.wanted if wanted is None else wanted
        space = self.space
        ids = np.concatenate([wanted.ids, space.parent[wanted.ids].astype(np.int64)])
        ids = ids[ids >= 0]
        tex = space.tex[ids].astype(np.int64)
        ids = unique_counts(ids[space.level[ids] < self.tables.first_pinned[tex]])[0]
        per_pool = np.bincount(self.pool_of[space.tex[ids].astype(np.int64)], minlength=MAX_POOLS)
        return {
            p: (int(per_pool[p]), self.stream_capacity(p))
            for p, ledger in enumerate(self.ledgers)
            if ledger is not None
        }

    def _step_bias(self, wanted: Wanted, finer: Callable[[], Wanted]) -> None:
        """One step of the budget's mip-bias controller, on the most loaded pool. Only when the next step
        down would cross to a finer level is the finer working set (`finer()`) measured instead, so the
        bias falls only when that set fits (else the level would flip between two every few frames)."""

        def worst(w: Wanted) -> tuple[int, int]:
            return max(self.pressure(w).values(), key=lambda nc: nc[0] / nc[1], default=(0, 1))

        bm, cfg = self.budget, self.config.budget
        if bm.bias == 0:
            if (pages := wanted.pool_pages) is None:  # counted by the feedback reduction, else here
                caps = [self.stream_capacity(p) for p, ledger in enumerate(self.ledgers) if ledger is not None]
                if 2 * len(wanted) < cfg.low_water * min(caps, default=0):
                    return  # all pages plus parents cannot fill even the smallest pool (no per-pool count)
                pages = np.bincount(self.pool_of[self.space.tex[wanted.ids].astype(np.int64)], minlength=MAX_POOLS)
            if all(2 * n < cfg.low_water * self.stream_capacity(p) for p, n in enumerate(pages.tolist()) if n):
                return  # no pool's pages plus parents can fill it: no pressure to measure
        need, cap = worst(wanted)
        b = bm.bias_levels
        if b > 0 and need <= cfg.high_water * cap and bm.bias - cfg.bias_step < b:
            need, cap = worst(finer())
        bm.update_bias(need, cap)

    # ---- sizing ---------------------------------------------------------------------------------
    def plan(self, available: int, max_layers: int) -> dict[int, int]:
        """Slots per pool index sharing `available` bytes (what the budget leaves after everything but
        the pools); the movers apply the resizes, shrinking first (`resize_order`)."""
        demands = {}
        for p, ledger in enumerate(self.ledgers):
            if ledger is None:
                continue
            hs = [self.headers[t] for t in self.textures_of(p)]
            g = self.geometry[p]
            assert g is not None
            demands[str(p)] = PoolDemand(
                g, len(hs), sum(self.pinned_tiles(h) for h in hs), sum(h.tile_count for h in hs), ledger.capacity
            )
        return {int(k): v for k, v in plan_capacities(demands, available, max_layers).items()}

    def resize_order(self, plan: dict[int, int]) -> list[int]:
        """Pools in the order to resize them: shrinking first, so that growth has room."""
        return sorted(plan, key=lambda p: plan[p] - self.ledgers[p].capacity)  # type: ignore[union-attr]

    def apply_resize(self, pool: int, result: ResizeResult) -> np.ndarray:
        """A pool was resized: page tables follow the moved slots, evicted tiles leave them. Returns
        the tiles whose loads were cancelled (their cache slots are gone: the uploader cancels them)."""
        if result.moved_from.size:
            self.tables.move_slots(self.textures_of(pool), result.moved_from, result.moved_to)
        self.tables.set_absent(result.evicted_tiles)
        return result.cancelled_tiles

    # ---- views ----------------------------------------------------------------------------------
    def completeness(self) -> Completeness:
        """The share of the newest feedback's wanted pages resident at the wanted level."""
        wanted = self.needed
        per: dict[int, float] = {}
        if len(wanted):
            ok = self.tables.is_resident(wanted.ids)
            tex = self.space.tex[wanted.ids].astype(np.int64)
            n = np.bincount(tex, minlength=MAX_TEXTURES)
            r = np.bincount(tex[ok], minlength=MAX_TEXTURES)
            got, total = int(np.count_nonzero(ok)), len(wanted)
        else:
            n = r = np.zeros(MAX_TEXTURES, np.int64)
            got = total = 0
        for t in self.headers:
            per[t] = float(r[t] / n[t]) if n[t] else 1.0
        overall = got / total if total else 1.0
        return Completeness(frame=self.frame, wanted_pages=total, resident_pages=got, overall=overall, per_texture=per)

    def totals(self) -> StreamTotals:
        return StreamTotals(**self._totals)

    def latency_percentiles(self) -> tuple[float, float, float]:
        """Frames from request to residency of the latest uploads: p50, p95, p99."""
        lat = np.array(self._latencies) if self._latencies else np.zeros(1)
        p50, p95, p99 = (float(v) for v in np.percentile(lat, [50, 95, 99]))
        return p50, p95, p99

    def corrupt_tiles(self, tex: int) -> int:
        """Distinct tiles of texture `tex` whose load failed at least once."""
        rng = self.space.ranges[tex]
        return int(np.count_nonzero(self.failed_tile[rng.start : rng.stop]))

    @property
    def resident_tiles(self) -> int:
        return int(self.tables.resident_count.sum())

    def check(self) -> None:
        """Assert the core's invariants: every ledger consistent, every table consistent, and the
        tables point only at slots their pool's ledger holds for the same tile."""
        for p, ledger in enumerate(self.ledgers):
            if ledger is None:
                continue
            ledger.check()
            for t in self.textures_of(p):
                self.tables.validate(t)
                rng = self.space.ranges[t]
                own = self.tables.own[rng.start : rng.stop].astype(np.int64)
                ids = np.arange(rng.start, rng.stop)[own >= 0]
                slots = own[own >= 0]
                assert (slots < ledger.capacity).all(), f"texture {t}: a page points past its pool"
                assert (ledger.tile[slots] == ids).all(), f"texture {t}: a page points at another tile's slot"
