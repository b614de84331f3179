"""The engine's cache pools as a set: one `CachePool` per (texel format, sRGB, slot size), each on its
own texture unit (``FIRST_UNIT + index``), sized together inside the budget.

`PoolSet` owns which pools exist, which pool each texture samples, how many slots hold textures'
pinned levels, the sizing plan (`pools.plan_capacities`) and the free-slot reserve kept ahead of
demand. It answers with records (`ResizeResult`, `Allocation`); the streamer applies them to the page
tables and the uploader. Render thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..config import StreamerConfig
from ..errors import EngineError
from ..gl.gl_ext import GLExt
from ..pack.format import PackHeader
from .budget import BudgetManager
from .feedback_reduce import Wanted, unique_counts
from .page_table import PageTables
from .pools import Allocation, CachePool, PoolDemand, PoolKey, ResizeResult, SlotGeometry, SlotState, plan_capacities
from .texture import FIRST_UNIT, MAX_POOLS
from .tiles import MAX_TEXTURES, TileSpace
from .uploader import LoadRecords

__all__ = ["PoolResize", "PoolSet"]


@dataclass(frozen=True)
class PoolResize:
    """One pool's resize by a plan: the pool and what the resize did."""

    pool: CachePool
    result: ResizeResult


class PoolSet:
    """Every cache pool of one streamer (see the module docstring)."""

    def __init__(self, gl: GLExt, budget: BudgetManager, config: StreamerConfig) -> None:
        self.gl, self.budget, self.config = gl, budget, config
        self.by_key: dict[PoolKey, CachePool] = {}
        self.by_index: list[CachePool | None] = [None] * MAX_POOLS
        self.of_tex = np.full(MAX_TEXTURES, -1, np.int64)  # pool index of each texture id
        self.level_pins = [0] * MAX_POOLS  # per pool: slots pinned for textures' coarsest levels

    def __iter__(self):  # noqa: ANN204
        return iter(list(self.by_key.values()))

    def pinned_tiles(self, h: PackHeader) -> int:
        """Tiles of a pack's pinned levels."""
        first = max(0, h.level_count - self.config.pinned_levels)
        return int(h.level_first[-1] - h.level_first[first])

    def geometry(self, h: PackHeader) -> SlotGeometry:
        max_slots = max(1, self.budget.budget // h.tile_raw_size)
        return SlotGeometry.choose(
            h.slot_size,
            h.tile_raw_size,
            max_slots,
            max_layers=self.gl.max_array_layers,
            max_texture_size=min(self.gl.max_texture_size, 16384),
        )

    def first_layers_bytes(self, key: PoolKey, h: PackHeader) -> int:
        """GPU bytes a texture's pool needs before it can open: nothing if the pool exists, else the
        whole layers its pinned tiles take."""
        if key in self.by_key:
            return 0
        g = self.geometry(h)
        return g.round_up(self.pinned_tiles(h)) // g.cells * g.layer_bytes

    def attach(self, key: PoolKey, tex: int, h: PackHeader) -> CachePool:
        """The pool texture `tex` samples, created (with room for its pinned tiles) if new."""
        pool = self.by_key.get(key)
        if pool is None:
            index = next((i for i, p in enumerate(self.by_index) if p is None), None)
            if index is None:
                raise EngineError(f"at most {MAX_POOLS} cache pools (texel format x slot size) can be open at once")
            g = self.geometry(h)
            pool = CachePool(
                self.gl,
                self.budget,
                key,
                index,
                g,
                g.round_up(max(1, self.pinned_tiles(h))),
                self.config.frames_in_flight,
                FIRST_UNIT,
            )
            self.by_key[key] = pool
            self.by_index[index] = pool
        pool.textures.append(tex)
        self.of_tex[tex] = pool.index
        return pool

    def detach(self, pool: CachePool, tex: int, frame: int, pinned_loaded: int) -> None:
        """Texture `tex` closed: its slots freed (after frames in flight), its pool dropped if empty."""
        self.level_pins[pool.index] -= pinned_loaded
        pool.release_texture(tex, frame)
        pool.textures.remove(tex)
        self.of_tex[tex] = -1
        if not pool.textures:
            pool.release()
            del self.by_key[pool.key]
            self.by_index[pool.index] = None
            self.level_pins[pool.index] = 0

    def plan(self, headers: dict[int, PackHeader], frame: int, budget: int | None = None) -> list[PoolResize]:
        """Resize every pool to its share of `budget` (default the current one) left after the other
        allocations; shrinking first, so that growth has room. Returns what each resize did."""
        held = self.budget.usage - sum(self.budget.reserved(p.name) for p in self)
        demands = {}
        for key, p in self.by_key.items():
            hs = [headers[t] for t in p.textures]
            demands[key] = PoolDemand(
                p.geometry, len(hs), sum(self.pinned_tiles(h) for h in hs), sum(h.tile_count for h in hs), p.capacity
            )
        available = (self.budget.budget if budget is None else budget) - held
        plan = plan_capacities(demands, available, self.gl.max_array_layers)
        order = sorted(plan, key=lambda k: plan[k] - self.by_key[k].capacity)
        return [PoolResize(self.by_key[k], self.by_key[k].resize(plan[k], frame)) for k in order]

    def reserve(self, pool: CachePool) -> int:
        """Free slots kept ahead of demand in `pool` (prefetch never takes them)."""
        return min(pool.capacity // 16, self.config.upload_tiles_per_frame)

    def keep_free(self, frame: int) -> list[Allocation]:
        """Evict LRU tiles no frame in flight uses until each pool holds its reserve of free slots: a
        load into a slot evicted on demand would wait frames_in_flight frames for its overwrite gate."""
        return [p.keep_free(frame, self.reserve(p)) for p in self]

    def free_loads(self, loads: LoadRecords) -> None:
        """Give back the cache slots of loads that ended without an upload (a slot a resize removed
        or re-let is left alone)."""
        for p in np.unique(loads.pool).tolist():
            pool = self.by_index[p]
            if pool is None:
                continue
            m = loads.pool == p
            cs, tiles = loads.cache_slot[m], loads.tiles[m]
            live = (cs >= 0) & (cs < pool.capacity)
            live[live] = (pool.tile[cs[live]] == tiles[live]) & (pool.state[cs[live]] == SlotState.LOADING)
            pool.free(cs[live])

    def mark_resident(self, loads: LoadRecords, frame: int) -> None:
        for p in np.unique(loads.pool).tolist():
            m = loads.pool == p
            self.by_index[p].mark_resident(loads.cache_slot[m], frame)  # type: ignore[union-attr]

    def touch(self, space: TileSpace, tables: PageTables, wanted: Wanted, frame: int) -> None:
        """Record a use of every slot `wanted` samples, and its parent's (trilinear reads both)."""
        if not len(wanted) or not self.by_key:
            return
        ids = np.concatenate([wanted.ids, space.parent[wanted.ids].astype(np.int64)])
        ids = ids[ids >= 0]
        slots = tables.sample_slot(ids)
        pool_of = self.of_tex[space.tex[ids].astype(np.int64)]
        for p in self:
            p.touch(slots[pool_of == p.index], frame)

    def capacity(self, pool: CachePool) -> int:
        """Slots a pool has for streamed tiles (those pinned for the coarsest levels do not count;
        make_all_resident's pins do)."""
        return max(1, pool.capacity - self.level_pins[pool.index])

    def pressure(self, space: TileSpace, tables: PageTables, wanted: Wanted) -> dict[str, tuple[int, int]]:
        """Per pool: (working set, capacity) of `wanted`: the wanted tiles plus their parents
        (trilinear samples both), pinned levels excluded."""
        ids = np.concatenate([wanted.ids, space.parent[wanted.ids].astype(np.int64)])
        ids = ids[ids >= 0]
        tex = space.tex[ids].astype(np.int64)
        ids = unique_counts(ids[space.level[ids] < tables.first_pinned[tex]])[0]
        per_pool = np.bincount(self.of_tex[space.tex[ids].astype(np.int64)], minlength=MAX_POOLS)
        return {p.name: (int(per_pool[p.index]), self.capacity(p)) for p in self}

    def step_bias(self, space: TileSpace, tables: PageTables, wanted: Wanted, finer: Callable[[], Wanted]) -> None:
        """One step of the budget's mip-bias controller, on the most loaded pool. Only when the next step
        down would cross to a finer level is the finer working set (`finer()`) measured instead, so the
        bias falls only when that set fits (else the level would flip between two every few frames)."""

        def worst(w: Wanted) -> tuple[int, int]:
            return max(self.pressure(space, tables, w).values(), key=lambda nc: nc[0] / nc[1], default=(0, 1))

        bm, cfg = self.budget, self.config.budget
        smallest = min((self.capacity(p) for p in self), default=1)
        if bm.bias == 0 and 2 * len(wanted) < cfg.low_water * smallest:
            return  # pages plus parents cannot fill any pool: no pressure to measure
        need, cap = worst(wanted)
        b = bm.bias_levels
        if b > 0 and need <= cfg.high_water * cap and bm.bias - cfg.bias_step < b:
            need, cap = worst(finer())
        bm.update_bias(need, cap)

    def release(self) -> None:
        for p in self:
            p.release()
        self.by_key.clear()
        self.by_index = [None] * MAX_POOLS
