"""SlotPool: LRU eviction, pins, eviction delay, resize; tile keys and slot geometry."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.errors import BudgetError
from texstream.runtime.tile_cache import (
    SlotGeometry,
    SlotPool,
    TileRecords,
    TileState,
    split_tile_keys,
    tile_keys,
)

GEOM = SlotGeometry(slot_size=136, slot_bytes=9248)
FIF = 3


def make_pool(capacity: int = 8, geometry: SlotGeometry = GEOM, fif: int = FIF, **kw) -> SlotPool:
    return SlotPool("pool/test", capacity, geometry, fif, **kw)


def load(pool: SlotPool, frame: int, tiles: list[tuple[int, int, int, int]]) -> list[int]:
    """Allocate and make resident each (tex, level, x, y) at `frame`; returns their slots."""
    a = np.array(tiles, np.int64).reshape(-1, 4)
    slots = pool.allocate_many(frame, a[:, 0], a[:, 1], a[:, 2], a[:, 3])
    assert (slots >= 0).all()
    pool.mark_uploading(slots)
    pool.mark_resident(slots, frame)
    return slots.tolist()


# ---- keys and geometry ---------------------------------------------------------------------------
def test_tile_keys_round_trip_and_order() -> None:
    rng = np.random.default_rng(1)
    tex = rng.integers(0, 32768, 1000)
    level = rng.integers(0, 64, 1000)
    x = rng.integers(0, 1 << 21, 1000)
    y = rng.integers(0, 1 << 21, 1000)
    keys = tile_keys(tex, level, x, y)
    assert keys.dtype == np.int64 and (keys >= 0).all()
    for got, want in zip(split_tile_keys(keys), (tex, level, x, y), strict=True):
        np.testing.assert_array_equal(got, want)
    assert tile_keys(1, 0, 0, 0) > tile_keys(0, 63, (1 << 21) - 1, (1 << 21) - 1)


@pytest.mark.parametrize(
    "bad", [(-1, 0, 0, 0), (1 << 15, 0, 0, 0), (0, 64, 0, 0), (0, 0, 1 << 21, 0), (0, 0, 0, -1)]
)
def test_tile_keys_reject_out_of_range(bad: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError, match="out of range"):
        tile_keys(*bad)


def test_geometry_locate_and_rounding() -> None:
    g = SlotGeometry(slot_size=136, slot_bytes=100, cells_x=3, cells_y=2)
    assert g.cells == 6 and g.layer_size == (408, 272) and g.layer_bytes == 600
    layer, cx, cy = g.locate(np.arange(13))
    np.testing.assert_array_equal(layer, [0] * 6 + [1] * 6 + [2])
    np.testing.assert_array_equal(cx, [0, 1, 2, 0, 1, 2] * 2 + [0])
    np.testing.assert_array_equal(cy, [0, 0, 0, 1, 1, 1] * 2 + [0])
    assert g.round_capacity(17) == 12 and g.round_capacity(-3) == 0


def test_geometry_choose_respects_layer_limit() -> None:
    assert SlotGeometry.choose(136, 9248, 2000).cells == 1
    g = SlotGeometry.choose(136, 9248, 120_000, max_layers=2048)
    assert g.cells_x == g.cells_y and g.cells * 2048 >= 120_000 and (g.cells_x - 1) ** 2 * 2048 < 120_000
    with pytest.raises(ValueError, match="texel limit"):
        SlotGeometry.choose(136, 9248, 10**9, max_layers=2048, max_texture_size=4096)


@pytest.mark.parametrize("kw", [{"slot_size": 130}, {"slot_bytes": 0}, {"cells_x": 0}])
def test_geometry_rejects_bad_values(kw: dict) -> None:
    args = {"slot_size": 136, "slot_bytes": 1} | kw
    with pytest.raises(ValueError):
        SlotGeometry(**args)


def test_pool_rejects_bad_capacity() -> None:
    g = SlotGeometry(slot_size=136, slot_bytes=1, cells_x=2, cells_y=2)
    with pytest.raises(ValueError, match="multiple of 4"):
        make_pool(6, g)
    with pytest.raises(ValueError, match="frames_in_flight"):
        make_pool(4, fif=0)


# ---- allocation and LRU ----------------------------------------------------------------------------
def test_allocate_takes_free_slots_lowest_first() -> None:
    pool = make_pool(4)
    assert [pool.allocate(0, 0, 0, i, 0) for i in range(4)] == [0, 1, 2, 3]
    assert pool.state.tolist() == [TileState.LOADING] * 4
    assert pool.slot_of(0, 0, 2, 0) == 2 and pool.slot_of(0, 0, 9, 9) is None
    assert pool.allocate(100, 0, 0, 9, 0) is None  # nothing resident, nothing evictable
    assert pool.stats.allocation_failures == 1
    pool.check()


def test_allocate_rejects_a_tile_twice() -> None:
    pool = make_pool(4)
    pool.allocate(0, 1, 2, 3, 4)
    with pytest.raises(ValueError, match="already holds slot 0"):
        pool.allocate(0, 1, 2, 3, 4)
    with pytest.raises(ValueError, match="twice"):
        pool.allocate_many(0, np.array([5, 5]), np.array([0, 0]), np.array([0, 0]), np.array([0, 0]))


def test_lru_order_of_eviction() -> None:
    seen: list[TileRecords] = []
    pool = make_pool(4, on_evict=seen.append)
    slots = load(pool, 0, [(0, 0, i, 0) for i in range(4)])
    # Last uses: tile0 @ 7, tile1 @ 2, tile2 @ 9, tile3 @ 5.
    for slot, frame in zip(slots, (7, 2, 9, 5), strict=True):
        pool.touch([slot], frame)
    got = pool.allocate_many(20, np.full(4, 1), np.zeros(4), np.arange(4), np.zeros(4))
    np.testing.assert_array_equal(got, [slots[1], slots[3], slots[0], slots[2]])
    ev = pool.take_evicted()
    assert [t[3] for t in ev.tuples()] == [1, 3, 0, 2]  # x of the evicted tiles, oldest first
    assert len(seen) == 1 and seen[0].tuples() == ev.tuples()
    assert len(pool.take_evicted()) == 0
    pool.check()


def test_lru_ties_evict_finer_levels_first() -> None:
    pool = make_pool(3)
    load(pool, 0, [(0, 2, 0, 0), (0, 0, 0, 0), (0, 1, 0, 0)])
    pool.allocate_many(10, np.full(3, 1), np.zeros(3), np.arange(3), np.zeros(3))
    assert [t[2] for t in pool.take_evicted().tuples()] == [0, 1, 2]


def test_free_slots_before_eviction() -> None:
    pool = make_pool(4)
    load(pool, 0, [(0, 0, 0, 0), (0, 0, 1, 0)])
    got = pool.allocate_many(50, np.zeros(3), np.ones(3), np.arange(3), np.zeros(3))
    np.testing.assert_array_equal(got, [2, 3, 0])
    assert len(pool.take_evicted()) == 1


def test_pins_are_never_evicted() -> None:
    pool = make_pool(4)
    slots = load(pool, 0, [(0, 5, 0, 0), (0, 4, 0, 0), (0, 0, 0, 0), (0, 0, 1, 0)])
    pool.pin(slots[:2])
    got = pool.allocate_many(100, np.ones(4), np.zeros(4), np.arange(4), np.zeros(4))
    np.testing.assert_array_equal(got, [slots[2], slots[3], -1, -1])
    assert pool.pinned[slots[:2]].all() and pool.pinned_count == 2
    pool.unpin(slots[0])
    pool.mark_resident(got[:2], 100)
    assert pool.allocate(200, 2, 0, 0, 0) == slots[0]


def test_pins_survive_random_pressure() -> None:
    rng = np.random.default_rng(7)
    pool = make_pool(32)
    pinned_slots = load(pool, 0, [(0, 9, i, 0) for i in range(6)])
    pool.pin(pinned_slots)
    pinned_keys = set(tile_keys(np.zeros(6), np.full(6, 9), np.arange(6), np.zeros(6)).tolist())
    n = 0
    for frame in range(1, 200):
        count = int(rng.integers(1, 6))
        got = pool.allocate_many(
            frame, np.ones(count), np.zeros(count), np.arange(n, n + count), np.zeros(count)
        )
        n += count
        ok = got[got >= 0]
        pool.mark_resident(ok, frame)
        pool.touch(rng.choice(32, 5), frame)
        ev = pool.take_evicted()
        assert not pinned_keys & set(ev.keys().tolist())
        pool.check()
    assert pool.pinned_count == 6


def test_eviction_delay_respects_frames_in_flight() -> None:
    pool = make_pool(2, fif=3)
    slots = load(pool, 0, [(0, 0, 0, 0), (0, 0, 1, 0)])
    pool.touch(slots, 10)
    for frame in (10, 11, 12):
        assert pool.allocate(frame, 1, 0, 0, 0) is None, f"evicted at frame {frame}, used at 10"
        assert pool.evictable_count(frame) == 0
    assert pool.allocate(13, 1, 0, 0, 0) in slots


def test_in_flight_slots_are_not_evicted() -> None:
    pool = make_pool(2)
    a = pool.allocate(0, 0, 0, 0, 0)
    b = pool.allocate(0, 0, 0, 1, 0)
    pool.mark_uploading(b)
    assert pool.allocate(100, 0, 0, 2, 0) is None
    pool.mark_resident([a], 0)
    assert pool.allocate(100, 0, 0, 2, 0) == a


def test_touch_ignores_free_and_negative_slots() -> None:
    pool = make_pool(4)
    s = load(pool, 0, [(0, 0, 0, 0)])[0]
    pool.touch(np.array([-1, s, 3, s]), 9)
    assert pool.last_used[s] == 9 and pool.state[3] == TileState.ABSENT
    pool.touch([s], 4)  # older use: last_used never goes back
    assert pool.last_used[s] == 9


def test_state_transitions_are_checked() -> None:
    pool = make_pool(4)
    s = pool.allocate(0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="state ABSENT"):
        pool.mark_uploading([1])
    pool.mark_uploading(s)
    with pytest.raises(ValueError, match="state UPLOADING"):
        pool.mark_uploading(s)
    pool.mark_resident(s, 1)
    with pytest.raises(ValueError, match="cannot free slot 0 in state RESIDENT"):
        pool.free(s)
    with pytest.raises(ValueError, match="out of range"):
        pool.pin([4])


def test_free_returns_failed_loads_at_once() -> None:
    pool = make_pool(2)
    a = pool.allocate(0, 0, 0, 0, 0)
    pool.allocate(0, 0, 0, 1, 0)
    rec = pool.free([a])
    assert rec.tuples() == [(a, 0, 0, 0, 0)]
    assert pool.allocate(0, 0, 0, 2, 0) == a
    pool.check()


def test_release_texture_cools_resident_slots() -> None:
    pool = make_pool(4, fif=2)
    load(pool, 0, [(7, 0, 0, 0), (7, 0, 1, 0), (3, 0, 0, 0)])
    inflight = pool.allocate(0, 7, 1, 0, 0)
    pool.touch([2], 20)  # the other texture's tile stays in use
    rec = pool.release_texture(7, frame=10)
    assert sorted(r[0] for r in rec.tuples()) == [0, 1, inflight]
    assert pool.used_count == 1 and pool.free_count == 3
    pool.check()
    # The in-flight slot is free at once; the resident ones only from frame 12.
    assert pool.allocate(10, 1, 0, 0, 0) == inflight
    assert pool.allocate(11, 1, 0, 1, 0) is None
    assert pool.allocate(12, 1, 0, 1, 0) == 0
    pool.check()


# ---- resize -----------------------------------------------------------------------------------------
def test_resize_grow_appends_free_slots() -> None:
    pool = make_pool(4)
    load(pool, 0, [(0, 0, i, 0) for i in range(4)])
    r = pool.resize(8)
    assert pool.capacity == 8 and pool.layers == 8 and r.new_layers == 8 and r.moves_from.size == 0
    assert pool.bytes_on_gpu == 8 * GEOM.slot_bytes
    assert pool.allocate(1, 1, 0, 0, 0) == 4
    pool.check()


def test_resize_shrink_keeps_mru_and_pinned_and_reports_moves() -> None:
    pool = make_pool(8)
    slots = load(pool, 0, [(0, 0, i, 0) for i in range(8)])
    uses = [3, 9, 1, 8, 2, 7, 6, 5]
    for s, f in zip(slots, uses, strict=True):
        pool.touch([s], f)
    pool.pin([slots[2]])  # oldest, but pinned
    r = pool.resize(4)
    # Keep: pinned slot 2, then MRU: slot 1 (9), slot 3 (8), slot 5 (7).
    kept_x = sorted(pool.x[pool.state == TileState.RESIDENT].tolist())
    assert kept_x == [1, 2, 3, 5]
    assert sorted(t[3] for t in r.evicted.tuples()) == [0, 4, 6, 7]
    # Slot 5 lived in a removed layer: it moves into a freed slot of the kept layers.
    np.testing.assert_array_equal(r.moves_from, [5])
    assert r.moves_to[0] == 0 and r.moved.tuples() == [(0, 0, 0, 5, 0)]
    assert pool.slot_of(0, 0, 5, 0) == 0 and pool.last_used[0] == 7
    assert pool.pinned[2] and pool.capacity == 4 and len(r.cancelled) == 0
    pool.check()


def test_resize_shrink_cancels_in_flight_in_removed_layers() -> None:
    pool = make_pool(4)
    load(pool, 0, [(0, 0, 0, 0)])
    pool.allocate(0, 0, 0, 1, 0)  # slot 1, LOADING: stays (kept layer)
    pool.allocate(0, 0, 0, 2, 0)  # slot 2, LOADING in a removed layer: cancelled
    r = pool.resize(2)
    assert r.cancelled.tuples() == [(2, 0, 0, 2, 0)]
    assert pool.state.tolist() == [TileState.RESIDENT, TileState.LOADING]
    pool.check()


def test_resize_refuses_when_pinned_do_not_fit() -> None:
    pool = make_pool(8)
    slots = load(pool, 0, [(0, 3, i, 0) for i in range(5)])
    pool.pin(slots)
    before = (pool.state.copy(), pool.capacity)
    with pytest.raises(BudgetError, match="5 pinned tiles"):
        pool.resize(4)
    assert pool.capacity == before[1] and np.array_equal(pool.state, before[0])
    pool.resize(5)  # exactly fits
    assert pool.pinned_count == 5
    pool.check()


def test_resize_in_whole_layers_with_cells() -> None:
    g = SlotGeometry(slot_size=136, slot_bytes=10, cells_x=2, cells_y=2)
    pool = make_pool(12, g)
    slots = load(pool, 0, [(0, 0, i, 0) for i in range(12)])
    for i, s in enumerate(slots):
        pool.touch([s], i)  # slot 11 most recent
    with pytest.raises(ValueError, match="multiple of 4"):
        pool.resize(6)
    r = pool.resize(4)
    assert (r.old_layers, r.new_layers) == (3, 1)
    assert sorted(pool.x.tolist()) == [8, 9, 10, 11]
    np.testing.assert_array_equal(r.moves_from, [8, 9, 10, 11])
    np.testing.assert_array_equal(np.sort(r.moves_to), [0, 1, 2, 3])
    assert len(r.evicted) == 8
    pool.check()


def test_random_operations_keep_pool_consistent() -> None:
    rng = np.random.default_rng(3)
    pool = make_pool(16)
    n = 0
    for frame in range(300):
        op = rng.integers(0, 6)
        if op <= 2:
            k = int(rng.integers(1, 5))
            got = pool.allocate_many(
                frame, rng.integers(0, 3, k), np.zeros(k), np.arange(n, n + k), np.zeros(k)
            )
            n += k
            got = got[got >= 0]
            if got.size:
                pool.mark_uploading(got)
                if rng.random() < 0.2:
                    pool.free(got[:1])
                    got = got[1:]
                pool.mark_resident(got, frame)
        elif op == 3:
            pool.touch(rng.integers(-1, pool.capacity, 4), frame)
        elif op == 4 and rng.random() < 0.3:
            pool.release_texture(int(rng.integers(0, 3)), frame)
        else:
            resident = np.flatnonzero(pool.state == TileState.RESIDENT)
            if resident.size and rng.random() < 0.5:
                pool.pin(resident[:1])
            try:
                pool.resize(int(rng.choice([8, 12, 16, 24])))
            except BudgetError:
                pass
        pool.check()
        assert pool.used_count + len(pool._free) + len(pool._cooling) == pool.capacity
