"""Which READY loads a frame uploads, and in which calls: one compiled call each on the render thread.

`choose_numpy` takes the READY ring slots in submission order, keeps those whose cache slot is
writable (its overwrite gate passed), then as many as the per-frame tile and byte caps allow (the
first always). `plan_numpy` sorts the chosen loads by pool and cache slot and splits each pool's
share into the maximal runs one upload call can write (`upload_plan.upload_runs`). `UploadChoice`
runs both as the compiled helper's ``ts_choose_uploads`` and ``ts_plan_uploads`` when it has them:
the same results (tested against these twins) for one ctypes call each, where the numpy versions
cost the render thread two or three dozen small array operations a frame (docs/BENCHMARKS.md: the
upload step 16 % cheaper on the NVIDIA H200 machine). Plain numpy and ctypes; no GL, no thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import native
from .compiled_loops import Addresses
from .int_sets import distinct
from .upload_plan import UPLOAD_RUN_DTYPE, PoolUploads, upload_runs

__all__ = ["RingLoads", "UploadChoice", "choose_numpy", "plan_numpy"]

_EMPTY = np.zeros(0, np.int64)


@dataclass(frozen=True)
class RingLoads:
    """The uploader's arrays per ring slot that the choice and the plan read (its own, not copies):
    each load's state (uint8), submission order, pool, cache slot and bytes (int64)."""

    state: np.ndarray
    seq: np.ndarray
    pool: np.ndarray
    cache_slot: np.ndarray
    nbytes: np.ndarray


def choose_numpy(
    loads: RingLoads, ready: int, writable: Sequence[np.ndarray | None], frame: int, max_tiles: int, max_bytes: int
) -> np.ndarray:
    """The ring slots a frame uploads, in submission order: state `ready`, ordered by ``seq`` (then
    slot), writable (``writable[pool][cache_slot] <= frame``; a pool whose entry is None: every slot),
    then the first `max_tiles` while their byte total stays <= `max_bytes` (the first always).
    ValueError for a load whose pool or cache slot is outside `writable`'s tables."""
    seq, pool, cache_slot, nbytes = loads.seq, loads.pool, loads.cache_slot, loads.nbytes
    slots = (loads.state == ready).nonzero()[0]
    if slots.size == 0 or max_tiles < 1:
        return _EMPTY
    slots = slots[np.argsort(seq[slots], kind="stable")]
    ok = np.ones(slots.size, bool)
    slot_pool = pool[slots]
    present = distinct(slot_pool)
    for p in present:
        if not 0 <= p < len(writable):
            raise ValueError(f"a load's pool {p} is outside the {len(writable)} pools")
        table = writable[p]
        if table is None:
            continue
        m = slice(None) if len(present) == 1 else slot_pool == p
        c = cache_slot[slots[m]]
        if c.min() < 0 or c.max() >= table.size:
            raise ValueError(f"a load's cache slot is outside pool {p}'s {table.size} slots")
        ok[m] = table[c] <= frame
    slots = slots[ok]
    size = np.cumsum(nbytes[slots])
    take = (size <= max_bytes) | (np.arange(slots.size) == 0)
    take &= np.arange(slots.size) < max_tiles
    return slots[take]


def plan_numpy(
    chosen: np.ndarray, pool: np.ndarray, cache_slot: np.ndarray, layers: np.ndarray, max_run: np.ndarray
) -> list[PoolUploads]:
    """Per pool (ascending), its loads sorted by cache slot and their upload calls: `upload_runs`
    over pool p's `layers[p]` layers, runs at most `max_run[p]` long (0: no bound). ValueError for a
    pool outside `layers` or one with no layers."""
    if chosen.size == 0:
        return []
    ordered = chosen[np.lexsort((cache_slot[chosen], pool[chosen]))]  # one sort: pool, then slot
    pool_of, cache = pool[ordered], cache_slot[ordered]
    if pool_of[0] < 0 or pool_of[-1] >= layers.size or (layers[distinct(pool_of)] < 1).any():
        raise ValueError("a load's pool is outside the pools, or has no layers")
    n = ordered.size
    bounds = [0, n] if pool_of[0] == pool_of[-1] else [0, *(np.diff(pool_of).nonzero()[0] + 1).tolist(), n]
    plan = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=False):
        p = int(pool_of[a])
        plan.append(
            PoolUploads(p, ordered[a:b], upload_runs(cache[a:b], ordered[a:b], int(layers[p]), int(max_run[p])))
        )
    return plan


class UploadChoice:
    """`choose_numpy` and `plan_numpy` for one uploader's ring of `ring_slots` slots, compiled when
    `compiled` and the helper has the loops (else numpy), with the compiled calls' scratch. `path`: a
    helper other than the installed one (the sanitizer replay's build)."""

    def __init__(self, ring_slots: int, compiled: bool, path: str | None = None) -> None:
        self._choose = native.choose_uploads(path) if compiled else None
        self._plan = native.plan_uploads(path) if compiled else None
        self._order = np.empty(2 * max(ring_slots, 1), np.int64)  # (key, slot) pairs
        self._out = np.empty(max(ring_slots, 1), np.int64)
        self._runs = np.empty(2 * max(ring_slots, 1), np.int64)  # (start, count) pairs
        self._groups = np.empty(5 * 16, np.int64)
        self._tables = np.zeros(16, np.int64)
        self._capacity = np.zeros(16, np.int64)
        self._at = Addresses()

    @property
    def compiled(self) -> bool:
        return self._choose is not None and self._plan is not None

    def choose(
        self,
        loads: RingLoads,
        ready: int,
        writable: Sequence[np.ndarray | None],
        frame: int,
        max_tiles: int,
        max_bytes: int,
    ) -> np.ndarray:
        """`choose_numpy`'s answer (a new array)."""
        if loads.state.size > self._out.size:
            raise ValueError(f"{loads.state.size} ring slots, but the choice was made for {self._out.size}")
        if self._choose is None:
            return choose_numpy(loads, ready, writable, frame, max_tiles, max_bytes)
        n_pools = len(writable)
        if self._tables.size < n_pools:
            self._tables, self._capacity = np.zeros(n_pools, np.int64), np.zeros(n_pools, np.int64)
        for p, table in enumerate(writable):
            self._tables[p] = 0 if table is None else self._at.of(table)
            self._capacity[p] = 0 if table is None else table.size
        at = self._at.of
        got = self._choose(
            loads.state.size,
            at(loads.state),
            ready,
            at(loads.seq),
            at(loads.pool),
            at(loads.cache_slot),
            at(loads.nbytes),
            n_pools,
            at(self._tables),
            at(self._capacity),
            frame,
            max_tiles,
            max_bytes,
            at(self._order),
            at(self._out),
        )
        if got < 0:
            raise ValueError("a load's pool or cache slot is outside the pools' tables")
        return self._out[:got].copy()

    def plan(
        self, chosen: np.ndarray, pool: np.ndarray, cache_slot: np.ndarray, layers: np.ndarray, max_run: np.ndarray
    ) -> list[PoolUploads]:
        """`plan_numpy`'s answer (arrays of their own); `layers` and `max_run` per pool, int64 (kept by
        the caller: their addresses are looked up once per array)."""
        n = chosen.size
        if self._plan is None or n == 0:
            return plan_numpy(chosen, pool, cache_slot, layers, max_run)
        if self._groups.size < 5 * layers.size:
            self._groups = np.empty(5 * layers.size, np.int64)
        chosen = np.ascontiguousarray(chosen, np.int64)
        ordered = np.empty(n, np.int64)
        at = self._at.of
        groups = self._plan(
            n,
            chosen.ctypes.data,
            at(pool),
            at(cache_slot),
            layers.size,
            at(layers),
            at(max_run),
            at(self._order),
            ordered.ctypes.data,
            at(self._runs),
            at(self._groups),
        )
        if groups < 0:
            raise ValueError("a load's pool is outside the pools or has no layers, or its cache slot is past 2^28")
        g = self._groups[: 5 * groups].tolist()
        total_runs = g[-2] + g[-1]
        runs = self._runs[: 2 * total_runs].view(UPLOAD_RUN_DTYPE).copy()
        return [
            PoolUploads(g[k], ordered[g[k + 1] : g[k + 1] + g[k + 2]], runs[g[k + 3] : g[k + 3] + g[k + 4]])
            for k in range(0, len(g), 5)
        ]
