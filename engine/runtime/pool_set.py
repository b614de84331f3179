"""The engine's cache pools as a set of movers: one `CachePool` per (texel format, sRGB, slot size),
each on its own texture unit (``FIRST_UNIT + index``).

`PoolSet` owns which pools exist (their GL texture arrays), which one a new texture samples, the
geometry a new pool gets, and carries out a sizing plan decided by `residency.Residency.plan`.
Which tiles the slots hold, pins, the reserve and pressure are the ledgers' and the residency core's.
Render thread only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..config import StreamerConfig
from ..errors import EngineError
from ..gl.gl_ext import GLExt
from ..pack.format import PackHeader
from .budget import BudgetManager
from .pools import CachePool, PoolKey
from .residency import Residency
from .slots import MAX_POOLS, ResizeResult, SlotGeometry
from .texture import FIRST_UNIT

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

    def __iter__(self) -> Iterator[CachePool]:
        return iter(list(self.by_key.values()))

    def geometry(self, h: PackHeader) -> SlotGeometry:
        max_slots = max(1, self.budget.budget // h.tile_raw_size)
        return SlotGeometry.choose(
            h.slot_size,
            h.tile_raw_size,
            max_slots,
            max_layers=self.gl.max_array_layers,
            max_texture_size=min(self.gl.max_texture_size, 16384),
        )

    def placement(self, key: PoolKey, h: PackHeader) -> tuple[int, SlotGeometry]:
        """(pool index, geometry) a texture of `key` would sample: -1 and a new geometry if no pool is."""
        pool = self.by_key.get(key)
        return (pool.index, pool.geometry) if pool is not None else (-1, self.geometry(h))

    def first_layers_bytes(self, key: PoolKey, pinned_tiles: int, h: PackHeader) -> int:
        """GPU bytes a texture's pool needs before it can open: nothing if the pool exists, else the
        whole layers its `pinned_tiles` take."""
        if key in self.by_key:
            return 0
        g = self.geometry(h)
        return g.round_up(pinned_tiles) // g.cells * g.layer_bytes

    def attach(self, key: PoolKey, tex: int, pinned_tiles: int, h: PackHeader) -> CachePool:
        """The pool texture `tex` samples, created (with room for its `pinned_tiles`) if new."""
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
                g.round_up(max(1, pinned_tiles)),
                self.config.frames_in_flight,
                FIRST_UNIT,
            )
            self.by_key[key] = pool
            self.by_index[index] = pool
        pool.textures.append(tex)
        return pool

    def detach(self, pool: CachePool, tex: int, empty: bool) -> None:
        """Texture `tex` closed; its pool's array is released when no texture samples it (`empty`)."""
        pool.textures.remove(tex)
        if empty:
            assert not pool.textures
            pool.release()
            del self.by_key[pool.key]
            self.by_index[pool.index] = None

    def held_elsewhere(self) -> int:
        """Budget bytes held by everything but the pools."""
        return self.budget.usage - sum(self.budget.reserved(p.name) for p in self)

    def apply(self, capacities: dict[int, int], order: list[int], frame: int) -> list[PoolResize]:
        """Resize pools (by index) to `capacities`, in `order`. Returns what each resize did."""
        out = []
        for p in order:
            pool = self.by_index[p]
            assert pool is not None
            out.append(PoolResize(pool, pool.resize(capacities[p], frame)))
        return out

    def replan(self, core: Residency, budget: int) -> list[PoolResize]:
        """Resize every pool to its share of `budget` as the core plans it (shrinking first), fold
        each resize into the core, and return what each did: the loads of its renamed slots must
        follow them and those of its cancelled tiles lost their cache slot."""
        plan = core.plan(budget - self.held_elsewhere(), self.gl.max_array_layers)
        out = self.apply(plan, core.resize_order(plan), core.frame)
        for r in out:
            core.apply_resize(r.pool.index, r.result)
        return out

    def release(self) -> None:
        for p in self:
            p.release()
        self.by_key.clear()
        self.by_index = [None] * MAX_POOLS
