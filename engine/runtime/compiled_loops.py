"""The residency core's compiled loops (`touch.DeciderLoops`), built from texstream's compiled helper
for whoever constructs a `residency.Residency` (the streamer, the sets bench): the core stays free of
ctypes and runs on numpy alone when the helper is not built.

The wrappers turn arrays into addresses; an array passed every frame (the page tables, the follower
table, the loops' scratch) is looked up once per array object: ``ndarray.ctypes.data`` costs about a
microsecond a call, and a frame makes a dozen of them.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import native
from .ledger_loops import LedgerLoops
from .requests import SCORE_LIMIT, SchedulerLoops
from .tiles import MAX_LEVELS, MAX_TEXTURES
from .touch import DeciderLoops

__all__ = ["Addresses", "decider_loops"]


class Addresses:
    """Data addresses of arrays, looked up once per array object. Holds a reference to every array it
    has seen, so an address is never that of a freed array (whose id another array might reuse)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[np.ndarray, int]] = {}

    def of(self, array: np.ndarray) -> int:
        hit = self._seen.get(id(array))
        if hit is not None and hit[0] is array:
            return hit[1]
        if len(self._seen) > 64:  # arrays replaced when the tables grow: forget the old ones
            self._seen.clear()
        address = int(array.ctypes.data)
        self._seen[id(array)] = (array, address)
        return address


@functools.cache
def decider_loops(path: str | None = None) -> DeciderLoops | None:
    """The compiled loops of the helper at `path` (None: the installed one), or None when it is not
    built or predates them (the core then uses numpy, to the same results)."""
    reduce_loop, sample = native.feedback_pages(path), native.sample_slots(path)
    scheduler, victims = _scheduler_loops(path), native.victim_keys(path)
    move, touch = native.move_pools(path), native.touch_pools(path)
    if None in (reduce_loop, sample, scheduler, victims, move, touch):
        return None
    addresses = Addresses()
    at = addresses.of

    def feedback_pages(
        values: np.ndarray,
        weights: np.ndarray | None,
        n_ids: int,
        level: np.ndarray,
        tex: np.ndarray,
        follow: np.ndarray,
        pool_of: np.ndarray | None,
        pool_pages: np.ndarray | None,
        scratch: np.ndarray,
        bits: np.ndarray,
        out_ids: np.ndarray,
        out_counts: np.ndarray,
        stats: np.ndarray,
    ) -> int:
        rows, k = follow.shape
        capacity = level.size
        if not (
            values.dtype == np.uint32
            and values.flags.c_contiguous
            and (weights is None or (weights.dtype == np.uint32 and weights.flags.c_contiguous))
            and (weights is None or weights.size >= values.size)
            and level.dtype == np.int8
            and tex.dtype == np.int16
            and tex.size == capacity
            and follow.dtype == np.int32
            and follow.flags.c_contiguous
            and 0 <= n_ids <= capacity
            and (k == 0 or rows >= n_ids)
            and (pool_of is None) == (pool_pages is None)
            and (pool_of is None or (pool_of.dtype == pool_pages.dtype == np.int64))  # type: ignore[union-attr]
            and scratch.dtype == np.int64
            and scratch.size >= capacity
            and bits.size * 64 >= capacity
            and min(out_ids.size, out_counts.size) >= min(values.size, n_ids) * (k + 1)
            and stats.size >= 2
        ):
            raise ValueError("feedback_pages: a table or buffer is too small or of the wrong type")
        groups = (None, 0, 0, None) if pool_of is None else (at(pool_of), pool_of.size, pool_pages.size, at(pool_pages))  # type: ignore[union-attr]
        return reduce_loop(
            values.size, values.ctypes.data, None if weights is None else weights.ctypes.data, n_ids, at(level),
            at(tex), at(follow), k, capacity, *groups, at(scratch), at(bits), at(out_ids), at(out_counts), at(stats),
        )  # fmt: skip

    def sample_slots(
        ids: np.ndarray,
        parent: np.ndarray,
        own: np.ndarray,
        tex: np.ndarray,
        pool_of: np.ndarray,
        n_pools: int,
        out: np.ndarray,
        stride: int,
        out_count: np.ndarray,
    ) -> int:
        if not (
            parent.size == own.size == tex.size
            and pool_of.size >= MAX_TEXTURES
            and out.size >= n_pools * stride
            and out_count.size >= n_pools
        ):
            raise ValueError("sample_slots: the tables or a buffer disagree on their sizes")
        return sample(
            ids.size, ids.ctypes.data, at(parent), at(own), at(tex), parent.size, at(pool_of), MAX_TEXTURES,
            n_pools, MAX_LEVELS, at(out), stride, at(out_count),
        )  # fmt: skip

    def victim_keys(
        state: np.ndarray,
        pinned: np.ndarray,
        last_used: np.ndarray,
        tex: np.ndarray,
        level: np.ndarray,
        priority: np.ndarray | None,
        frame: int,
        frames_in_flight: int,
        idle_clip: int,
        slot_bits: int,
        count: int,
        out_keys: np.ndarray,
    ) -> int:
        capacity = state.size
        if not (
            state.dtype == np.uint8
            and pinned.dtype == np.bool_
            and last_used.dtype == out_keys.dtype == np.int64
            and tex.dtype == np.int16
            and level.dtype == np.int8
            and pinned.size == last_used.size == tex.size == level.size == capacity
            and out_keys.size >= count
            and (priority is None or (priority.dtype == np.float64 and priority.size >= MAX_TEXTURES))
        ):
            raise ValueError("victim_keys: a ledger array or buffer is too small or of the wrong type")
        weights = None if priority is None else at(priority)  # NULL: idle time unweighed
        return victims(
            capacity, at(state), at(pinned), at(last_used), at(tex), at(level), weights, MAX_TEXTURES, frame,
            frames_in_flight, idle_clip, slot_bits, count, at(out_keys),
        )  # fmt: skip

    def move_pools(slots: np.ndarray, pools: np.ndarray, table: np.ndarray, frame: int, old: int, new: int) -> int:
        n_pools = table.shape[1]
        if not (
            slots.dtype == pools.dtype == table.dtype == np.int64
            and slots.flags.c_contiguous
            and pools.flags.c_contiguous
            and pools.size >= slots.size
            and table.shape[0] == 3
            and table.flags.c_contiguous
        ):
            raise ValueError("move_pools: the loads or the ledgers' table are of the wrong type")
        rows = at(table)
        return move(
            slots.size, slots.ctypes.data, pools.ctypes.data, n_pools, rows, rows + 8 * n_pools, rows + 16 * n_pools,
            frame, old, new,
        )  # fmt: skip

    def touch_pools(slots: np.ndarray, counts: np.ndarray, table: np.ndarray, frame: int) -> int:
        n_pools = table.shape[1]
        if not (
            slots.dtype == counts.dtype == table.dtype == np.int64
            and slots.ndim == 2
            and slots.flags.c_contiguous
            and slots.shape[0] >= n_pools
            and counts.size >= n_pools
            and table.shape[0] == 3
            and table.flags.c_contiguous
        ):
            raise ValueError("touch_pools: the slots or the ledgers' table are of the wrong type")
        rows = at(table)
        return touch(n_pools, at(slots), slots.shape[1], at(counts), rows + 8 * n_pools, rows + 16 * n_pools, frame)

    return DeciderLoops(
        feedback_pages=feedback_pages,
        sample_slots=sample_slots,
        scheduler=scheduler,
        ledger=LedgerLoops(victim_keys=victim_keys, move_pools=move_pools, touch_pools=touch_pools),
    )


def _pages_fit(ids: np.ndarray, counts: np.ndarray) -> bool:
    """Whether a walk's pages and their counts are int64, contiguous, a count for every page."""
    return (
        ids.dtype == counts.dtype == np.int64
        and ids.flags.c_contiguous
        and counts.flags.c_contiguous
        and counts.size >= ids.size
    )


def _grids_fit(*grids: np.ndarray) -> bool:
    """Whether per-texture, per-level tables (`TileSpace.level_first`, ``tiles_x``, ``tiles_y``) are
    what the compiled walks index: int64, MAX_TEXTURES x MAX_LEVELS, contiguous."""
    return all(a.dtype == np.int64 and a.shape == (MAX_TEXTURES, MAX_LEVELS) and a.flags.c_contiguous for a in grids)


def _scheduler_loops(path: str | None) -> SchedulerLoops | None:
    """The request scheduler's compiled passes from the helper at `path`, or None (see `decider_loops`)."""
    chains, prefetch, merge = native.missing_chains(path), native.prefetch_pages(path), native.merge_requests(path)
    keys, widen = native.queue_keys(path), native.widen_pages(path)
    if chains is None or prefetch is None or merge is None or keys is None:
        return None
    at = Addresses().of

    def missing_chains(
        ids: np.ndarray,
        counts: np.ndarray,
        parent: np.ndarray,
        own: np.ndarray,
        level: np.ndarray,
        tex: np.ndarray,
        level_count: np.ndarray,
        priority: np.ndarray,
        scratch: np.ndarray,
        bits: np.ndarray,
        gap: np.ndarray,
        resident: np.ndarray,
        out_ids: np.ndarray,
        out_weights: np.ndarray,
    ) -> int:
        n, capacity = ids.size, parent.size
        if not (
            _pages_fit(ids, counts)
            and parent.dtype == own.dtype == np.int32
            and level.dtype == np.int8
            and tex.dtype == np.int16
            and own.size == level.size == tex.size == capacity
            and level_count.dtype == np.int64
            and level_count.size >= MAX_TEXTURES
            and priority.dtype == np.float64
            and priority.size >= MAX_TEXTURES
            and scratch.dtype == np.int64
            and scratch.size >= capacity
            and bits.size * 64 >= capacity
            and gap.size >= 2 * n
            and resident.dtype == np.uint8
            and resident.size >= n
            and min(out_ids.size, out_weights.size) >= n * MAX_LEVELS
        ):
            raise ValueError("missing_chains: a table or buffer is too small or of the wrong type")
        return chains(
            n, ids.ctypes.data, counts.ctypes.data, at(parent), at(own), at(level), at(tex), capacity,
            at(level_count), at(priority), MAX_TEXTURES, MAX_LEVELS, SCORE_LIMIT, at(scratch), at(bits), at(gap),
            at(resident), at(out_ids), at(out_weights),
        )  # fmt: skip

    def prefetch_pages(
        ids: np.ndarray,
        counts: np.ndarray,
        resident: np.ndarray,
        tex: np.ndarray,
        level: np.ndarray,
        parent: np.ndarray,
        own: np.ndarray,
        level_first: np.ndarray,
        tiles_x: np.ndarray,
        tiles_y: np.ndarray,
        priority: np.ndarray,
        scratch: np.ndarray,
        bits: np.ndarray,
        out_ids: np.ndarray,
        out_weights: np.ndarray,
    ) -> int:
        n, capacity = ids.size, parent.size
        if not (
            _pages_fit(ids, counts)
            and resident.dtype == np.uint8
            and resident.flags.c_contiguous
            and resident.size >= n
            and parent.dtype == own.dtype == np.int32
            and level.dtype == np.int8
            and tex.dtype == np.int16
            and own.size == level.size == tex.size == capacity
            and _grids_fit(level_first, tiles_x, tiles_y)
            and priority.dtype == np.float64
            and priority.size >= MAX_TEXTURES
            and scratch.dtype == np.int64
            and scratch.size >= capacity
            and bits.size * 64 >= capacity
            and min(out_ids.size, out_weights.size) >= 8 * n
        ):
            raise ValueError("prefetch_pages: a table or buffer is too small or of the wrong type")
        return prefetch(
            n, ids.ctypes.data, counts.ctypes.data, resident.ctypes.data, at(tex), at(level), at(parent), at(own),
            capacity, at(level_first), at(tiles_x), at(tiles_y), at(priority), MAX_TEXTURES, MAX_LEVELS, SCORE_LIMIT,
            at(scratch), at(bits), at(out_ids), at(out_weights),
        )  # fmt: skip

    def merge_requests(
        ids: np.ndarray,
        weights: np.ndarray,
        loading: np.ndarray,
        frame: int,
        tier: int,
        state: np.ndarray,
        retry_at: np.ndarray,
        last_wanted: np.ndarray,
        score: np.ndarray,
        tiers: np.ndarray,
        out_fresh: np.ndarray,
        counts: np.ndarray,
    ) -> int:
        n, capacity = ids.size, state.size
        if not (
            ids.dtype == weights.dtype == np.int64
            and ids.flags.c_contiguous
            and weights.flags.c_contiguous
            and weights.size >= n
            and loading.dtype == np.uint8
            and loading.flags.c_contiguous
            and loading.size >= n
            and state.dtype == tiers.dtype == np.uint8
            and retry_at.dtype == last_wanted.dtype == score.dtype == np.int64
            and retry_at.size == last_wanted.size == score.size == tiers.size == capacity
            and out_fresh.dtype == counts.dtype == np.int64
            and out_fresh.size >= n
            and counts.size >= 2
        ):
            raise ValueError("merge_requests: a table or buffer is too small or of the wrong type")
        return merge(
            n, ids.ctypes.data, weights.ctypes.data, loading.ctypes.data, frame, tier, SCORE_LIMIT, capacity, at(state),
            at(retry_at), at(last_wanted), at(score), at(tiers), at(out_fresh), at(counts),
        )  # fmt: skip

    def queue_keys(
        q: np.ndarray,
        loading: np.ndarray,
        state: np.ndarray,
        level: np.ndarray,
        own: np.ndarray,
        last_wanted: np.ndarray,
        score: np.ndarray,
        tiers: np.ndarray,
        frame: int,
        cancel_after: int,
        flags: np.ndarray,
        out_q: np.ndarray,
        out_keys: np.ndarray,
        counts: np.ndarray,
    ) -> int:
        n, capacity = q.size, state.size
        if not (
            q.dtype == np.int64
            and q.flags.c_contiguous
            and loading.dtype == flags.dtype == np.uint8
            and loading.flags.c_contiguous
            and min(loading.size, flags.size, out_q.size, out_keys.size) >= n
            and state.dtype == tiers.dtype == np.uint8
            and level.dtype == np.int8
            and own.dtype == np.int32
            and last_wanted.dtype == score.dtype == out_q.dtype == counts.dtype == np.int64
            and level.size == own.size == last_wanted.size == score.size == tiers.size == capacity
            and out_keys.dtype == np.uint64
            and counts.size >= 1
        ):
            raise ValueError("queue_keys: a table or buffer is too small or of the wrong type")
        return keys(
            n, q.ctypes.data, loading.ctypes.data, capacity, at(state), at(level), at(own), at(last_wanted), at(score),
            at(tiers), frame, cancel_after, MAX_LEVELS, SCORE_LIMIT, at(flags), at(out_q), at(out_keys), at(counts),
        )  # fmt: skip

    def widen_pages(
        ids: np.ndarray,
        counts: np.ndarray,
        tex: np.ndarray,
        level: np.ndarray,
        grids: tuple[np.ndarray, ...],
        *out: np.ndarray,
    ) -> int:
        """`grids`: level_first, tiles_x, tiles_y; `out`: scratch, bits, out_ids, out_counts."""
        (level_first, tiles_x, tiles_y), (scratch, bits, out_ids, out_counts) = grids, out
        n, capacity = ids.size, level.size
        if not (
            _pages_fit(ids, counts)
            and level.dtype == np.int8
            and tex.dtype == np.int16
            and tex.size == capacity
            and _grids_fit(*grids)
            and scratch.dtype == np.int64
            and scratch.size >= capacity
            and bits.dtype == np.uint64
            and bits.size * 64 >= capacity
            and out_ids.dtype == out_counts.dtype == np.int64
            and min(out_ids.size, out_counts.size) >= 9 * n
        ):
            raise ValueError("widen_pages: a table or buffer is too small or of the wrong type")
        return widen(  # type: ignore[misc]
            n, ids.ctypes.data, counts.ctypes.data, capacity, at(tex), at(level), at(level_first), at(tiles_x),
            at(tiles_y), MAX_TEXTURES, MAX_LEVELS, at(scratch), at(bits), at(out_ids), at(out_counts),
        )  # fmt: skip

    return SchedulerLoops(
        missing_chains=missing_chains,
        prefetch_pages=prefetch_pages,
        merge_requests=merge_requests,
        queue_keys=queue_keys,
        widen_pages=widen_pages if widen is not None else None,
    )
