"""The cache slots a frame's wanted pages sample, by pool: what `Residency` marks as used each frame
(the least-recently-used clock of every `slots.SlotLedger`), without GL.

A page samples its own tile when that is resident, else its nearest resident ancestor; trilinear
filtering also reads the next level, so every page's parent counts too. The compiled helper
(``ts_sample_slots``, handed in as a `DeciderLoops`) walks the page tables in one call; without it
numpy does the same walk one level at a time over all pages, to the same slots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .feedback_reduce import FeedbackLoop
from .ledger_loops import LedgerLoops
from .page_table import PageTables
from .requests import SchedulerLoops
from .tiles import TileSpace

__all__ = ["DeciderLoops", "PoolSlots", "SampledSlots", "WalkLoop"]

# (ids, parent, own, tex, pool_of, n_pools, out, stride, out_count) -> slots written, or -1: ``ts_sample_slots``
WalkLoop = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, np.ndarray, int, np.ndarray], int]


@dataclass(frozen=True, kw_only=True)
class DeciderLoops:
    """The residency core's compiled loops, handed in by whoever builds it (`compiled_loops.
    decider_loops`): the core itself loads no compiled code, so it runs and is tested anywhere."""

    feedback_pages: FeedbackLoop  # feedback to wanted pages, sets expanded (`feedback_reduce.FeedbackReducer`)
    sample_slots: WalkLoop  # the slots pages and their parents sample (`SampledSlots`)
    scheduler: SchedulerLoops  # the request scheduler's demand, prefetch and queueing (`requests`)
    ledger: LedgerLoops  # a cache pool's victims, arrivals and uses (`slots.SlotLedger.weigh_by`)


@dataclass(frozen=True)
class PoolSlots:
    """Cache slots grouped by pool index: pool p's are ``slots[p, :counts[p]]`` (int64; the rest of a
    row is padding)."""

    slots: np.ndarray  # pools x width
    counts: np.ndarray  # per pool


class SampledSlots:
    """Finds, for a frame's wanted pages, the slots they and their parents sample, grouped by pool.

    Parameters
    ----------
    space, tables
        The tile id space and the page tables (read only: their owners write them).
    walk_loop
        The compiled walk (`DeciderLoops.sample_slots`), or None: numpy, the same slots.
    """

    def __init__(self, space: TileSpace, tables: PageTables, *, walk_loop: WalkLoop | None = None) -> None:
        self.space = space
        self.tables = tables
        self._compiled = walk_loop
        self._out = np.zeros(0, np.int64)
        self._count = np.zeros(0, np.int64)
        self._last: tuple[tuple[np.ndarray, int, tuple[int, ...]], PoolSlots] | None = None

    def by_pool(self, ids: np.ndarray, pool_of: np.ndarray, pools: list[int]) -> list[tuple[int, np.ndarray]]:
        """(pool, slots) for every pool of `pools`: the slots pages `ids` and their parents sample
        (pages with nothing resident above them are left out; a slot may be listed twice).
        `pool_of`: pool index per texture id (MAX_TEXTURES entries)."""
        found = self.grouped(ids, pool_of, pools)
        return [(p, found.slots[p, : int(found.counts[p])]) for p in pools]

    def grouped(self, ids: np.ndarray, pool_of: np.ndarray, pools: list[int]) -> PoolSlots:
        """`by_pool`'s answer as one array (`PoolSlots`: what `pool_ledgers.PoolLedgers.touch` takes). The
        same `ids` object against unchanged tables (a still view) gets the last answer again without
        a walk."""
        key = (ids, self.tables.version, tuple(pools))
        last = self._last
        if last is not None and last[0][0] is ids and last[0][1:] == key[1:]:
            return last[1]
        found = self._find(np.ascontiguousarray(ids, np.int64), pool_of, pools)
        self._last = (key, found)
        return found

    def _find(self, ids: np.ndarray, pool_of: np.ndarray, pools: list[int]) -> PoolSlots:
        n_pools = max(pools, default=-1) + 1
        if self._compiled is not None and pools:
            return self._find_compiled(ids, pool_of, n_pools, pools)
        both = np.concatenate([ids, self.space.parent[ids].astype(np.int64)])
        both = both[both >= 0]
        slots = self.tables.sample_slot(both)
        pool = pool_of[self.space.tex[both].astype(np.int64)]
        keep = slots >= 0
        per_pool = [slots[keep & (pool == p)] if p in pools else slots[:0] for p in range(n_pools)]
        counts = np.array([s.size for s in per_pool], np.int64)
        out = np.full((n_pools, int(counts.max(initial=0))), -1, np.int64)
        for p, s in enumerate(per_pool):
            out[p, : s.size] = s
        return PoolSlots(out, counts)

    def _find_compiled(self, ids: np.ndarray, pool_of: np.ndarray, n_pools: int, pools: list[int]) -> PoolSlots:
        space, tables = self.space, self.tables
        stride = max(2 * ids.size, 1)
        if self._out.size < n_pools * stride:
            self._out = np.empty(n_pools * max(stride, 1024), np.int64)
        if self._count.size < n_pools:
            self._count = np.zeros(n_pools, np.int64)
        pool_of = np.ascontiguousarray(pool_of, np.int64)  # the loop checks the sizes against each other
        got = self._compiled(ids, space.parent, tables.own, space.tex, pool_of, n_pools, self._out, stride, self._count)
        if got < 0:
            raise ValueError("touch: a page id, texture or pool is outside the tables")
        counts = self._count[:n_pools].copy()
        if len(pools) < n_pools:  # pools not asked for (no ledger) count nothing, as in numpy
            counts[np.setdiff1d(np.arange(n_pools), pools)] = 0
        width = int(counts.max(initial=0))
        return PoolSlots(self._out[: n_pools * stride].reshape(n_pools, stride)[:, :width].copy(), counts)
