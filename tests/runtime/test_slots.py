"""SlotLedger, SlotGeometry and plan_capacities without GL: allocation and LRU eviction, pins, eviction
and overwrite delays, state checks, texture release, shrink plans, runs of consecutive slots, and pool
sizing; hypothesis property tests for the ledger's invariants under random operation sequences.

Tile and texture ids are plain integers: the ledger does not interpret them. What needs the GL texture
array (bytes in the budget, GPU contents across resizes) is in test_pools.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from texstream.errors import BudgetError
from texstream.runtime.compiled_loops import decider_loops
from texstream.runtime.pool_sizing import PoolDemand, plan_capacities
from texstream.runtime.slots import (
    RUN_DTYPE,
    Allocation,
    CacheSlotState,
    ResizeResult,
    SlotGeometry,
    SlotLedger,
    slot_runs,
)

NAME = "pool/bc1-srgb/136"
GEOM = SlotGeometry(slot_size=136, slot_bytes=9248)  # one 136-texel BC1 slot per layer
FIF = 3

MakeLedger = Callable[..., SlotLedger]


@pytest.fixture
def make_ledger() -> MakeLedger:
    def make(capacity: int = 8, geometry: SlotGeometry = GEOM, fif: int = FIF) -> SlotLedger:
        return SlotLedger(NAME, capacity, fif, geometry.cells)

    return make


def allocate(ledger: SlotLedger, frame: int, tiles, tex=0, levels=0) -> Allocation:
    tiles = np.asarray(tiles, np.int64).ravel()
    tex = np.broadcast_to(np.asarray(tex, np.int64), tiles.shape)
    levels = np.broadcast_to(np.asarray(levels, np.int64), tiles.shape)
    return ledger.allocate(frame, tiles, tex, levels)


def load(ledger: SlotLedger, frame: int, tiles, tex=0, levels=0) -> np.ndarray:
    """Allocate `tiles` at `frame` and make them resident; returns their slots."""
    slots = allocate(ledger, frame, tiles, tex, levels).slots
    assert (slots >= 0).all()
    ledger.mark_resident(slots, frame)
    return slots


def resize(ledger: SlotLedger, capacity: int, frame: int = 0) -> ResizeResult:
    """What `CachePool.resize` does to its ledger (without the GPU copies)."""
    ledger.check_capacity(capacity)
    if capacity == ledger.capacity:
        return ResizeResult.empty()
    if capacity > ledger.capacity:
        result = ledger.grow(capacity)
    else:
        result = ledger.apply_shrink(ledger.plan_shrink(capacity))
    ledger.open_gates()
    return result


def snapshot(ledger: SlotLedger) -> dict[str, object]:
    return {
        "capacity": ledger.capacity,
        **{
            name: getattr(ledger, name).copy()
            for name in ("state", "tile", "tex", "level", "last_used", "pinned", "writable_at")
        },
    }


def assert_unchanged(ledger: SlotLedger, before: dict[str, object]) -> None:
    after = snapshot(ledger)
    for name, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(after[name], value, err_msg=name)
        else:
            assert after[name] == value, name


def test_geometry_locate_and_rounding() -> None:
    g = SlotGeometry(slot_size=136, slot_bytes=100, cells_x=3, cells_y=3)
    assert g.cells == 9 and g.layer_size == (408, 408) and g.layer_bytes == 900
    # cell-major: with 2 layers, slots 0, 1 are layers 0, 1 of cell 0; 2, 3 of cell 1; ...
    layer, cx, cy = g.locate(np.arange(18), layers=2)
    np.testing.assert_array_equal(layer, [0, 1] * 9)
    np.testing.assert_array_equal(cx, np.repeat([0, 1, 2] * 3, 2))
    np.testing.assert_array_equal(cy, np.repeat([0, 0, 0, 1, 1, 1, 2, 2, 2], 2))
    assert [int(v) for v in g.locate(13, layers=3)] == [1, 1, 1]  # cell 4 = (1, 1), layer 1
    np.testing.assert_array_equal(g.renumber(np.array([0, 1, 2, 5]), 2, 4), [0, 1, 4, 9])
    np.testing.assert_array_equal(g.renumber(np.array([0, 5, 9]), 4, 2), [0, 3, 5])
    with pytest.raises(ValueError, match="does not exist"):
        g.renumber(np.array([3]), 4, 2)
    with pytest.raises(ValueError, match="layers"):
        g.locate(0, layers=0)
    assert g.round_capacity(17) == 9 and g.round_capacity(18) == 18 and g.round_capacity(-3) == 0
    assert g.round_up(19) == 27 and g.round_up(18) == 18 and g.round_up(0) == 0 and g.round_up(-5) == 0
    assert GEOM.cells == 1 and GEOM.layer_size == (136, 136) and GEOM.layer_bytes == 9248


def test_geometry_choose_picks_the_smallest_square_grid() -> None:
    assert SlotGeometry.choose(136, 9248, 2048).cells == 1
    g = SlotGeometry.choose(136, 9248, 2049)
    assert (g.cells_x, g.cells_y) == (2, 2) and (g.slot_size, g.slot_bytes) == (136, 9248)
    g = SlotGeometry.choose(136, 9248, 120_000, max_layers=2048)
    assert g.cells_x == g.cells_y and g.cells * 2048 >= 120_000 and (g.cells_x - 1) ** 2 * 2048 < 120_000
    assert SlotGeometry.choose(136, 9248, 10, max_layers=1).cells_x == 4  # 3 x 3 = 9 < 10
    assert SlotGeometry.choose(136, 9248, 9, max_layers=1).cells_x == 3
    # exactly at the texel limit is fine; one grid step more is not
    assert SlotGeometry.choose(128, 8192, 16, max_layers=1, max_texture_size=512).cells_x == 4
    with pytest.raises(ValueError, match="texel limit"):
        SlotGeometry.choose(128, 8192, 17, max_layers=1, max_texture_size=512)
    with pytest.raises(ValueError, match="texel limit"):
        SlotGeometry.choose(136, 9248, 10**9, max_layers=2048, max_texture_size=4096)


@pytest.mark.parametrize("kw", [{"max_slots": 0}, {"max_layers": 0}, {"max_slots": -4}])
def test_geometry_choose_rejects_bad_counts(kw: dict) -> None:
    args = {"max_slots": 100, "max_layers": 2048} | kw
    with pytest.raises(ValueError, match=">= 1"):
        SlotGeometry.choose(136, 9248, args.pop("max_slots"), **args)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"slot_size": 130}, "slot size"),
        ({"slot_size": 0}, "slot size"),
        ({"slot_size": -8}, "slot size"),
        ({"slot_bytes": 0}, "slot bytes"),
        ({"cells_x": 0}, "cells per layer"),
        ({"cells_y": 0}, "cells per layer"),
    ],
)
def test_geometry_rejects_bad_values(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SlotGeometry(**({"slot_size": 136, "slot_bytes": 1} | kw))


def test_non_square_cell_grids_are_refused() -> None:
    """Texture arrays are square: a grid of cells that is not cannot be laid out exactly."""
    for cx, cy in ((2, 1), (1, 3)):
        with pytest.raises(ValueError, match="square grid"):
            SlotGeometry(slot_size=136, slot_bytes=9248, cells_x=cx, cells_y=cy)


def test_counts(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(8)
    resident = load(ledger, 0, [10, 11, 12], levels=[0, 1, 2])
    loading = allocate(ledger, 0, [20, 21]).slots
    ledger.pin([resident[2], loading[0]])
    assert ledger.free_count == 3 and ledger.used_count == 5
    assert ledger.resident_count == 3 and ledger.pinned_count == 2
    np.testing.assert_array_equal(ledger.resident_tile_ids(), [10, 11, 12])
    np.testing.assert_array_equal(ledger.level[resident], [0, 1, 2])
    ledger.mark_resident(loading, 1)
    np.testing.assert_array_equal(ledger.resident_tile_ids(), [10, 11, 12, 20, 21])
    assert ledger.resident_count == 5
    ledger.check()


def test_allocate_takes_free_slots_lowest_first(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(4)
    got = [int(allocate(ledger, 0, [i], tex=5, levels=i).slots[0]) for i in range(3)]
    assert got == [0, 1, 2]
    a = allocate(ledger, 1, [3, 4])
    np.testing.assert_array_equal(a.slots, [3, -1])  # nothing resident, nothing evictable
    assert a.slots.dtype == np.int64
    assert a.evicted_tiles.size == a.evicted_slots.size == a.evicted_last_used.size == 0
    assert (ledger.state == CacheSlotState.LOADING).all()
    np.testing.assert_array_equal(ledger.tile, [0, 1, 2, 3])
    np.testing.assert_array_equal(ledger.tex, [5, 5, 5, 0])
    np.testing.assert_array_equal(ledger.last_used, [0, 0, 0, 1])
    assert allocate(ledger, 0, []).slots.size == 0
    ledger.check()


def test_freed_slots_are_reused_lowest_first(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(8)
    slots = allocate(ledger, 0, [0, 1, 2, 3]).slots
    np.testing.assert_array_equal(slots, [0, 1, 2, 3])
    ledger.free(slots[0])
    ledger.free(slots[2])
    # free slots 0, 2, 4..7: the lowest come first whatever order they were freed in
    np.testing.assert_array_equal(allocate(ledger, 1, [10, 11, 12]).slots, [0, 2, 4])
    ledger.check()


def test_allocate_prefers_writable_lowest_free_slots_after_releases(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(8)
    load(ledger, 0, [0, 1, 2, 3], tex=1)
    load(ledger, 0, [4, 5, 6, 7], tex=2)
    ledger.release_texture(1, frame=1)  # slots 0..3 writable from frame 4
    ledger.release_texture(2, frame=100)  # slots 4..7 writable only from frame 103
    slots = allocate(ledger, 100, [8]).slots
    assert slots.tolist() == [0], "a free, writable lower slot was passed over"
    assert ledger.writable_at[slots[0]] <= 100


def test_lru_order_of_eviction(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(4)
    slots = load(ledger, 0, [100, 101, 102, 103])
    for slot, frame in zip(slots, (7, 2, 9, 5), strict=True):
        ledger.touch(np.array([slot]), frame)
    a = allocate(ledger, 20, [200, 201, 202, 203], tex=1)
    np.testing.assert_array_equal(a.slots, [0, 1, 2, 3])  # handed out in slot order: one run
    np.testing.assert_array_equal(a.evicted_slots, [1, 3, 0, 2])  # chosen and reported oldest first
    np.testing.assert_array_equal(a.evicted_tiles, [101, 103, 100, 102])
    np.testing.assert_array_equal(a.evicted_last_used, [2, 5, 7, 9])
    np.testing.assert_array_equal(ledger.tile[a.slots], [200, 201, 202, 203])
    assert a.runs.tolist() == [(0, 0, 4)]
    assert (ledger.state == CacheSlotState.LOADING).all() and (ledger.tex == 1).all()
    assert (ledger.writable_at == 20 + FIF).all()  # the overwrite gate of every evicted slot
    ledger.check()


def test_gates_open_once_the_gpu_finished_the_draws_before_the_eviction(make_ledger: MakeLedger) -> None:
    """A slot evicted at frame 20 may be sampled by draws of frames up to 19 only: writable as soon as a
    fence behind frame 19 signalled, never before; other gates keep their frame."""
    ledger = make_ledger(4)
    load(ledger, 0, [100, 101, 102, 103])
    allocate(ledger, 20, [200, 201])  # evicts slots 0 and 1 at frame 20
    (late,) = ledger.keep_free(22, 1).evicted_slots  # one more evicted at frame 22
    assert ledger.writable_at[[0, 1, late]].tolist() == [20 + FIF, 20 + FIF, 22 + FIF]
    assert ledger.open_gates_before(18, 21) == 0  # frame 19's draws may still run
    assert ledger.writable_at[[0, 1, late]].tolist() == [20 + FIF, 20 + FIF, 22 + FIF]
    assert ledger.open_gates_before(19, 21) == 2
    assert ledger.writable_at[[0, 1]].tolist() == [21, 21] and ledger.writable_at[late] == 22 + FIF
    assert ledger.open_gates_before(20, 22) == 0  # `late` left at 22: draws of 21 may sample it
    assert ledger.open_gates_before(21, 23) == 1 and ledger.writable_at[late] == 23
    assert ledger.open_gates_before(30, 40) == 0  # nothing gated any more
    ledger.check()


@pytest.mark.parametrize("seed", range(4))
def test_gates_open_early_exactly_for_slots_left_before_the_finished_draws(make_ledger: MakeLedger, seed: int) -> None:
    """Random evictions, texture releases and fence reports: after each report a slot's gate is the
    frame of the report if its tile left at E <= done + 1 and its gate had not passed, else unchanged
    (a model that keeps each slot's latest leaving frame)."""
    rng = np.random.default_rng(seed)
    ledger = make_ledger(32)
    left_at = np.full(32, -1000)  # the frame each slot's tile last left it
    done, tile = -1, 1000
    for frame in range(1, 120):
        before = ledger.writable_at.copy()
        evicted = np.zeros(0, np.int64)
        roll = rng.random()
        if roll < 0.5:  # loads for new tiles, evicting the idle ones once the pool is full
            n = int(rng.integers(1, 6))
            a = allocate(ledger, frame, np.arange(tile, tile + n), tex=int(rng.integers(0, 3)))
            tile += n
            ledger.mark_resident(a.slots[a.slots >= 0], frame)
            evicted = a.evicted_slots
        elif roll < 0.7:
            evicted = ledger.keep_free(frame, int(rng.integers(1, 8))).evicted_slots
        elif roll < 0.75:
            texture = int(rng.integers(0, 3))
            held = ((ledger.tex == texture) & (ledger.state == CacheSlotState.RESIDENT)).nonzero()[0]
            ledger.release_texture(texture, frame)
            evicted = held
        left_at[evicted] = frame
        if rng.random() < 0.6:  # a fence behind frame `done` signalled
            done = max(done, frame - 1 - int(rng.integers(0, 4)))  # never backwards
            before = ledger.writable_at.copy()
            ledger.open_gates_before(done, frame)
            opens = (before > frame) & (left_at <= done + 1)
            np.testing.assert_array_equal(ledger.writable_at, np.where(opens, frame, before))
        assert (ledger.writable_at[left_at > done + 1] == (left_at + FIF)[left_at > done + 1]).all()
        ledger.check()


def test_free_slots_before_eviction(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(4)
    load(ledger, 0, [0, 1])
    ledger.touch(np.array([0]), 5)
    a = allocate(ledger, 50, [10, 11, 12])
    np.testing.assert_array_equal(a.slots, [2, 3, 1])
    np.testing.assert_array_equal(a.evicted_tiles, [1])
    np.testing.assert_array_equal(a.evicted_slots, [1])
    np.testing.assert_array_equal(a.evicted_last_used, [0])
    assert ledger.writable_at[1] == 50 + FIF and ledger.writable_at[2] <= 50 and ledger.writable_at[3] <= 50
    ledger.check()


def test_lru_ties_evict_finer_levels_first(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(3)
    load(ledger, 0, [0, 1, 2], levels=[2, 0, 1])
    a = allocate(ledger, 10, [10, 11, 12])
    np.testing.assert_array_equal(a.evicted_slots, [1, 2, 0])
    np.testing.assert_array_equal(a.evicted_tiles, [1, 2, 0])


def test_partial_eviction_picks_the_oldest_then_finest(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(8)
    load(ledger, 0, np.arange(8), levels=[3, 1, 0, 2, 0, 1, 0, 2])
    ledger.touch(np.array([6]), 4)  # a level-0 tile used later than the others
    a = allocate(ledger, 10, [100, 101])
    np.testing.assert_array_equal(a.evicted_slots, [2, 4])  # level 0, last used 0; lowest slot first
    a = allocate(ledger, 10, [102, 103, 104])
    np.testing.assert_array_equal(a.evicted_slots, [1, 5, 3])  # level 1, 1, then 2
    ledger.check()


def test_pins_are_never_evicted(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(4)
    slots = load(ledger, 0, [0, 1, 2, 3], levels=[5, 4, 0, 0])
    ledger.pin(slots[:2])
    a = allocate(ledger, 100, [10, 11, 12, 13])
    np.testing.assert_array_equal(a.slots, [slots[2], slots[3], -1, -1])
    assert ledger.pinned[slots[:2]].all() and ledger.pinned_count == 2
    ledger.unpin(slots[0])
    assert ledger.pinned_count == 1
    ledger.mark_resident(a.slots[:2], 100)
    a = allocate(ledger, 200, [14])
    np.testing.assert_array_equal(a.slots, [slots[0]])
    np.testing.assert_array_equal(a.evicted_tiles, [0])
    ledger.check()


def test_pins_survive_random_pressure(make_ledger: MakeLedger) -> None:
    rng = np.random.default_rng(7)
    ledger = make_ledger(32)
    pinned_slots = load(ledger, 0, np.arange(1000, 1006), levels=9)
    ledger.pin(pinned_slots)
    next_tile = 0
    evicted = 0
    for frame in range(1, 200):
        count = int(rng.integers(1, 6))
        a = allocate(ledger, frame, np.arange(next_tile, next_tile + count), levels=rng.integers(0, 4, count))
        next_tile += count
        assert not set(a.evicted_tiles.tolist()) & set(range(1000, 1006))
        evicted += a.evicted_tiles.size
        ledger.mark_resident(a.slots[a.slots >= 0], frame)
        ledger.touch(rng.choice(32, 5), frame)
        ledger.check()
    assert evicted > 100  # the ledger was under pressure
    assert ledger.pinned_count == 6
    np.testing.assert_array_equal(ledger.tile[pinned_slots], np.arange(1000, 1006))
    assert (ledger.state[pinned_slots] == CacheSlotState.RESIDENT).all()


def test_eviction_delay_respects_frames_in_flight(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(2, fif=3)
    slots = load(ledger, 0, [0, 1])
    ledger.touch(slots, 10)
    for frame in (10, 11, 12):
        assert not ledger.evictable_mask(frame).any()
        assert allocate(ledger, frame, [5]).slots.tolist() == [-1], f"evicted at frame {frame}, used at 10"
    assert ledger.evictable_mask(13).all()
    a = allocate(ledger, 13, [5])
    assert a.slots[0] in slots.tolist() and ledger.writable_at[a.slots[0]] == 16


def test_loading_slots_are_never_evicted(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(2)
    a, b = allocate(ledger, 0, [0, 1]).slots
    assert allocate(ledger, 100, [2]).slots.tolist() == [-1]
    assert not ledger.evictable_mask(100).any()
    ledger.mark_resident(a, 0)
    assert allocate(ledger, 100, [2]).slots.tolist() == [a]
    assert ledger.state[b] == CacheSlotState.LOADING and ledger.tile[b] == 1


def test_mark_resident_counts_as_a_use(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(2)
    a, b = allocate(ledger, 5, [0, 1]).slots
    ledger.mark_resident(a, 9)  # its upload was issued at frame 9: evictable from frame 12
    ledger.mark_resident(b, 5)
    assert ledger.last_used[a] == 9 and ledger.last_used[b] == 5
    np.testing.assert_array_equal(ledger.evictable_mask(4 + FIF), [False, False])
    np.testing.assert_array_equal(ledger.evictable_mask(5 + FIF), [False, True])
    np.testing.assert_array_equal(ledger.evictable_mask(8 + FIF), [False, True])
    np.testing.assert_array_equal(ledger.evictable_mask(9 + FIF), [True, True])


def test_touch_ignores_negative_and_out_of_range_slots(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(4)
    s, other = load(ledger, 0, [0, 1])
    ledger.touch(np.array([-1, s, 4, 99, -7]), 9)
    assert ledger.last_used[s] == 9 and ledger.last_used[other] == 0
    ledger.touch(np.array([-1, -1]), 12)
    assert ledger.last_used[s] == 9 and ledger.last_used[other] == 0
    ledger.check()


def test_state_transitions_are_checked(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(4)
    s = int(allocate(ledger, 0, [0]).slots[0])
    before = snapshot(ledger)
    with pytest.raises(ValueError, match="cannot mark resident slot 1 in state FREE"):
        ledger.mark_resident([s, 1], 0)
    with pytest.raises(ValueError, match="cannot pin slot 2 in state FREE"):
        ledger.pin(2)
    with pytest.raises(ValueError, match="cannot unpin slot 3 in state FREE"):
        ledger.unpin([3])
    with pytest.raises(ValueError, match="cannot free slot 1 in state FREE"):
        ledger.free([1])
    with pytest.raises(ValueError, match="out of range 0..3"):
        ledger.pin([4])
    with pytest.raises(ValueError, match="out of range"):
        ledger.mark_resident([-1], 0)
    assert_unchanged(ledger, before)  # a refused call changes nothing, not even its valid slots
    ledger.pin(s)  # a LOADING slot may be pinned
    assert ledger.pinned[s]
    ledger.mark_resident(s, 1)
    with pytest.raises(ValueError, match=f"{ledger.name}: cannot mark resident slot 0 in state RESIDENT"):
        ledger.mark_resident(s, 2)
    with pytest.raises(ValueError, match="cannot free slot 0 in state RESIDENT"):
        ledger.free(s)
    ledger.unpin(s)
    assert not ledger.pinned[s]
    ledger.check()


def test_free_returns_failed_loads_at_once(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(2)
    a, b = allocate(ledger, 0, [0, 1]).slots
    ledger.pin(a)
    ledger.free([a, a])  # a slot listed twice is freed once
    assert ledger.state[a] == CacheSlotState.FREE and ledger.tile[a] == -1 and not ledger.pinned[a]
    assert ledger.free_count == 1 and ledger.pinned_count == 0
    ledger.check()
    assert ledger.writable_at[a] <= 0  # nothing was written: no overwrite gate
    assert allocate(ledger, 0, [2]).slots.tolist() == [a]
    ledger.check()


def test_release_texture_cools_resident_slots(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(4, fif=2)
    load(ledger, 0, [0, 1], tex=7)
    load(ledger, 0, [2], tex=3)
    inflight = int(allocate(ledger, 0, [5], tex=7).slots[0])
    ledger.pin([0, inflight])
    ledger.touch(np.array([2]), 20)  # the other texture's tile stays in use
    tiles, slots = ledger.release_texture(7, frame=10)
    np.testing.assert_array_equal(tiles, [5])
    np.testing.assert_array_equal(slots, [inflight])
    assert ledger.used_count == 1 and ledger.free_count == 3 and ledger.pinned_count == 0
    assert (ledger.state[[0, 1, inflight]] == CacheSlotState.FREE).all() and (ledger.tile[[0, 1, inflight]] == -1).all()
    assert ledger.tile[2] == 2 and ledger.state[2] == CacheSlotState.RESIDENT and ledger.tex[2] == 3
    # slots that held tiles wait for the frames in flight; the loading one had nothing written into it
    np.testing.assert_array_equal(ledger.writable_at[[0, 1]], [12, 12])
    assert ledger.writable_at[inflight] <= 10
    ledger.check()
    empty_tiles, empty_slots = ledger.release_texture(7, frame=11)
    assert empty_tiles.size == empty_slots.size == 0


def test_resize_shrink_keeps_coarser_levels_among_equal_uses(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(4)
    load(ledger, 0, [0, 1, 2, 3], levels=[0, 2, 1, 3])
    r = resize(ledger, 2, frame=1)
    np.testing.assert_array_equal(np.sort(ledger.resident_tile_ids()), [1, 3])
    np.testing.assert_array_equal(np.sort(r.evicted_tiles), [0, 2])
    np.testing.assert_array_equal(r.moved_from, [3])
    np.testing.assert_array_equal(r.moved_to, [0])
    ledger.check()


def test_resize_shrink_cancels_loading_slots_in_removed_layers(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(4)
    load(ledger, 0, [0])
    allocate(ledger, 0, [1, 2, 3])  # slot 1 LOADING in a kept layer: stays; slots 2, 3 in removed layers
    ledger.pin(3)
    r = resize(ledger, 2, frame=1)
    np.testing.assert_array_equal(r.cancelled_tiles, [2, 3])
    np.testing.assert_array_equal(r.cancelled_slots, [2, 3])
    assert r.moved_from.size == r.evicted_tiles.size == 0
    assert ledger.state.tolist() == [CacheSlotState.RESIDENT, CacheSlotState.LOADING]
    np.testing.assert_array_equal(ledger.tile, [0, 1])
    assert ledger.pinned_count == 0 and ledger.free_count == 0
    ledger.check()


def test_resize_shrink_keeps_loading_slots_of_kept_layers_before_recent_tiles(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(4)
    allocate(ledger, 0, [0])  # slot 0: LOADING since frame 0
    load(ledger, 0, [1, 2, 3])
    ledger.touch(np.array([1, 2, 3]), 50)
    r = resize(ledger, 2, frame=60)
    assert ledger.state.tolist() == [CacheSlotState.LOADING, CacheSlotState.RESIDENT]
    np.testing.assert_array_equal(ledger.tile, [0, 1])
    np.testing.assert_array_equal(np.sort(r.evicted_tiles), [2, 3])
    assert r.cancelled_tiles.size == r.moved_from.size == 0
    ledger.check()


def test_resize_refuses_when_pinned_plus_kept_loading_do_not_fit(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(4)
    loading = allocate(ledger, 0, [0, 1]).slots  # slots 0, 1: LOADING in the layers a shrink keeps
    pinned = load(ledger, 0, [2, 3])
    ledger.pin(pinned)
    before = snapshot(ledger)
    for capacity in (2, 3):
        with pytest.raises(BudgetError, match="2 pinned tiles plus 2 loading slots"):
            resize(ledger, capacity, frame=5)
        assert_unchanged(ledger, before)
    ledger.mark_resident(loading, 1)  # now only the pinned tiles must stay
    r = resize(ledger, 2, frame=5)
    np.testing.assert_array_equal(r.moved_from, [2, 3])
    np.testing.assert_array_equal(r.moved_to, [0, 1])
    np.testing.assert_array_equal(np.sort(r.evicted_tiles), [0, 1])
    np.testing.assert_array_equal(ledger.tile, [2, 3])
    assert ledger.pinned.all()
    ledger.check()


def geom(slot_bytes: int, cells: int = 1) -> SlotGeometry:
    return SlotGeometry(slot_size=136, slot_bytes=slot_bytes, cells_x=cells, cells_y=cells)


def demand(g: SlotGeometry, textures: int = 1, pinned: int = 0, total: int = 10**6) -> PoolDemand:
    return PoolDemand(geometry=g, textures=textures, pinned_tiles=pinned, total_tiles=total, current=g.cells)


def plan_bytes(plan: dict[str, int], demands: dict[str, PoolDemand]) -> int:
    return sum(plan[k] // d.geometry.cells * d.geometry.layer_bytes for k, d in demands.items())


def test_plan_shares_by_textures_times_slot_bytes() -> None:
    demands = {"a": demand(geom(100), textures=2), "b": demand(geom(300), textures=1)}
    # weights 200 : 300 of 10000 bytes: 4000 bytes = 40 slots, 6000 bytes = 20 slots (20 per texture each)
    assert plan_capacities(demands, 10_000, 2048) == {"a": 40, "b": 20}
    assert plan_capacities({"a": demand(geom(100), textures=3)}, 10_000, 2048) == {"a": 100}


def test_plan_rounds_down_to_whole_layers() -> None:
    demands = {"a": demand(geom(100, cells=2), textures=2), "b": demand(geom(300), textures=1)}
    # a's share: 4240 bytes = 42 slots -> 40 (10 layers of 4); b's: 6360 bytes = 21 slots
    plan = plan_capacities(demands, 10_600, 2048)
    assert plan == {"a": 40, "b": 21}
    assert plan_bytes(plan, demands) <= 10_600


def test_plan_gives_at_least_the_pinned_tiles_in_whole_layers() -> None:
    demands = {"a": demand(geom(100, cells=2), pinned=61), "b": demand(geom(100), total=10)}
    plan = plan_capacities(demands, 10_000, 2048)  # a's share is 50 slots, its pinned tiles need 64
    assert plan == {"a": 64, "b": 10}
    assert plan_bytes(plan, demands) <= 10_000


def test_plan_never_exceeds_the_textures_tiles() -> None:
    demands = {"a": demand(geom(100, cells=2), total=5), "b": demand(geom(100), total=7), "c": demand(geom(100))}
    plan = plan_capacities(demands, 30_000, 2048)
    assert plan["a"] == 8 and plan["b"] == 7  # 5 tiles in whole layers of 4; 7 tiles
    assert plan["c"] == 100  # its own share


def test_plan_gives_every_pool_a_layer_and_respects_the_layer_limit() -> None:
    demands = {"a": demand(geom(100, cells=2), textures=0, total=0), "b": demand(geom(100), total=50)}
    plan = plan_capacities(demands, 10_000, 2048)
    assert plan == {"a": 4, "b": 50}  # a: no share and no tiles, still one layer
    plan = plan_capacities({"a": demand(geom(100, cells=2))}, 10_000, max_layers=3)
    assert plan == {"a": 12}


def test_plan_refuses_when_the_pinned_tiles_do_not_fit() -> None:
    with pytest.raises(BudgetError, match="pinned"):
        plan_capacities({"a": demand(geom(100), pinned=20)}, 1_000, 2048)
    with pytest.raises(BudgetError, match="pinned"):
        plan_capacities({"a": demand(geom(100), pinned=6), "b": demand(geom(100), pinned=6)}, 1_000, 2048)
    with pytest.raises(BudgetError):  # five pinned tiles take two layers of four
        plan_capacities({"a": demand(geom(100, cells=2), pinned=5)}, 700, 2048)
    assert plan_capacities({"a": demand(geom(100, cells=2), pinned=5)}, 800, 2048) == {"a": 8}


def test_plan_fits_when_the_pinned_tiles_fit() -> None:
    """A ledger whose pinned tiles exceed its share takes them from the others' shares."""
    demands = {"a": demand(geom(100), pinned=8, total=20), "b": demand(geom(100), total=100)}
    # 10 slots of budget: a needs its 8 pinned tiles, b at least one layer -> 9 slots fit
    plan = plan_capacities(demands, 1_000, 2048)
    assert plan["a"] >= 8 and plan["b"] >= 1
    assert plan_bytes(plan, demands) <= 1_000


def test_plan_random_demands_hold_their_bounds() -> None:
    rng = np.random.default_rng(11)
    planned = 0
    for _ in range(300):
        demands = {}
        for k in range(int(rng.integers(1, 5))):
            g = geom(int(rng.choice([8, 16, 100, 9248])), cells=int(rng.integers(1, 4)))
            total = int(rng.integers(0, 5000))
            demands[f"p{k}"] = demand(g, int(rng.integers(0, 6)), int(rng.integers(0, total // 10 + 1)), total)
        available = int(rng.integers(1, 4_000_000))
        max_layers = int(rng.choice([64, 2048]))
        try:
            plan = plan_capacities(demands, available, max_layers)
        except BudgetError:
            continue
        planned += 1
        assert plan.keys() == demands.keys()
        assert plan_bytes(plan, demands) <= available
        for k, d in demands.items():
            g = d.geometry
            assert plan[k] % g.cells == 0 and g.cells <= plan[k] <= max_layers * g.cells
            assert plan[k] >= min(g.round_up(d.pinned_tiles), max_layers * g.cells)
            assert plan[k] <= max(g.round_up(d.total_tiles), g.round_up(d.pinned_tiles), g.cells)
    assert planned > 150


def test_keep_free_evicts_lru_tiles_ahead_of_demand(make_ledger: MakeLedger) -> None:
    """keep_free tops the free slots up to a count by evicting least recently used, unpinned tiles
    unused for frames_in_flight frames; their slots pass the overwrite gate frames_in_flight later."""
    ledger = make_ledger(8)
    slots = ledger.allocate(0, np.arange(8), np.zeros(8), np.zeros(8)).slots
    ledger.mark_resident(slots, 0)
    ledger.touch(slots[4:], 5)  # tiles 4..7 used recently
    ledger.pin(slots[0])
    assert len(ledger.keep_free(6, 0).evicted_tiles) == 0  # nothing asked
    ev = ledger.keep_free(6, 3)
    assert sorted(ev.evicted_tiles.tolist()) == [1, 2, 3] and (ev.evicted_last_used == 0).all()
    assert ledger.free_count == 3 and ledger.resident_count == 5
    assert (ledger.writable_at[ev.evicted_slots] == 6 + FIF).all()
    assert len(ledger.keep_free(6, 3).evicted_tiles) == 0  # already free enough
    more = ledger.keep_free(6, 8)  # tiles 4..7 are too recent and tile 0 is pinned: none can go
    assert len(more.evicted_tiles) == 0
    got = ledger.allocate(6, np.array([10]), np.array([0]), np.array([0])).slots
    assert got[0] in ev.evicted_slots.tolist()  # a free slot, no eviction on demand
    ledger.check()


# ---- construction ------------------------------------------------------------------------------------
def test_ledger_rejects_bad_capacity_and_frames_in_flight() -> None:
    for bad in (6, 0, -4, 2, 4.0):
        with pytest.raises(ValueError, match="multiple of 4 slots"):
            SlotLedger(NAME, bad, FIF, cells=4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multiple of 1 slots"):
        SlotLedger(NAME, 0, FIF)
    with pytest.raises(ValueError, match="frames_in_flight"):
        SlotLedger(NAME, 4, 0)
    with pytest.raises(ValueError, match="cells per layer"):
        SlotLedger(NAME, 4, FIF, cells=0)


# ---- runs of consecutive slots -------------------------------------------------------------------------
def test_slot_runs_split_at_gaps_cells_and_skip_missing_slots() -> None:
    runs = slot_runs(np.array([3, 4, 5, 9, -1, 10, 2]), layers=100)
    assert runs.dtype == RUN_DTYPE
    assert runs.tolist() == [(3, 3, 3), (9, 9, 2), (2, 2, 1)]
    # 4 layers per cell: slots 6..13 cross two cell boundaries (at 8 and 12)
    with_cells = slot_runs(np.arange(6, 14), layers=4)
    assert with_cells.tolist() == [(6, 2, 2), (8, 0, 4), (12, 0, 2)]
    assert slot_runs(np.array([-1, -1]), 4).size == 0 and slot_runs(np.zeros(0, np.int64), 4).dtype == RUN_DTYPE
    with pytest.raises(ValueError, match="layers"):
        slot_runs(np.arange(3), 0)


def test_loads_fill_the_layers_of_one_cell_before_the_next(make_ledger: MakeLedger) -> None:
    """Cell-major numbering: the lowest free slots are consecutive layers of cell 0, so a frame's
    loads into a fresh pool of 4 cells x 4 layers are one run per cell."""
    ledger = make_ledger(16, geometry=geom(9248, cells=2))
    a = allocate(ledger, 0, np.arange(10))
    assert a.runs.tolist() == [(0, 0, 4), (4, 0, 4), (8, 0, 2)]


def test_a_grow_renumbers_held_slots_into_the_same_cell_and_layer(make_ledger: MakeLedger) -> None:
    g = geom(9248, cells=2)
    ledger = make_ledger(8, geometry=g)  # 4 cells x 2 layers
    slots = load(ledger, 0, np.arange(5))  # slots 0..4: cells 0, 0, 1, 1, 2
    allocate(ledger, 0, [77])  # slot 5: loading, in cell 2 layer 1
    ledger.pin(slots[3])
    before = snapshot(ledger)
    r = resize(ledger, 16)  # 4 cells x 4 layers
    old_cell_layer = np.stack(g.locate(r.moved_from, 2))
    new_cell_layer = np.stack(g.locate(r.moved_to, 4))
    np.testing.assert_array_equal(old_cell_layer, new_cell_layer)
    np.testing.assert_array_equal(r.moved_from, [2, 3, 4, 5])  # cell 0 keeps its numbers
    np.testing.assert_array_equal(r.moved_to, [4, 5, 8, 9])
    for name in ("tile", "state", "pinned", "tex", "level"):
        np.testing.assert_array_equal(getattr(ledger, name)[r.moved_to], before[name][r.moved_from], err_msg=name)
    assert ledger.free_count == 10 and ledger.layers == 4
    ledger.check()


def test_one_frame_of_loads_into_a_fresh_ledger_is_one_run(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(64)
    a = allocate(ledger, 0, np.arange(40))
    assert a.runs.tolist() == [(0, 0, 40)]
    assert int(a.runs["count"].sum()) == 40


def test_scattered_victims_come_in_slot_order_and_neighbours_join_runs(make_ledger: MakeLedger) -> None:
    """Evicting old tiles from every other slot cannot be one run, but the victims are handed out in
    slot order, so adjacent victims share a run and the run count is the minimum for the set."""
    ledger = make_ledger(16)
    slots = load(ledger, 0, np.arange(16))
    recent = slots[[2, 3, 7, 11, 12, 13]]
    ledger.touch(recent, 50)  # these stay; the others are the oldest
    a = allocate(ledger, 50, np.arange(100, 110))
    got = np.sort(a.slots)
    np.testing.assert_array_equal(got, np.setdiff1d(np.arange(16), recent))
    np.testing.assert_array_equal(a.slots, got)  # handed out ascending
    assert a.runs.tolist() == [(0, 0, 2), (4, 4, 3), (8, 8, 3), (14, 14, 2)]


# ---- property tests -----------------------------------------------------------------------------------
OPS = st.lists(
    st.tuples(st.integers(0, 7), st.integers(0, 2**31 - 1)),
    min_size=1,
    max_size=80,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, cells=st.sampled_from([1, 2, 4]), fif=st.integers(1, 4))
def test_ledger_invariants_hold_under_random_operations(ops: list[tuple[int, int]], cells: int, fif: int) -> None:
    """Random allocate / mark resident / free / touch / pin / release / keep free / resize against a
    model of the tiles the ledger holds: check() holds after every step, every tile that leaves is
    reported, a pinned tile never leaves except with its texture or a cancelled load, an evicted
    slot's gate is frames_in_flight ahead, and allocations hand out slots as runs that cover exactly
    the slots they gave."""
    ledger = SlotLedger(NAME, 4 * cells, fif, cells)
    held: dict[int, int] = {}  # tile -> texture
    pinned: set[int] = set()
    next_tile = 0
    for frame, (op, seed) in enumerate(ops):
        rng = np.random.default_rng(seed)
        if op <= 2:
            k = int(rng.integers(1, 7))
            new, tex = np.arange(next_tile, next_tile + k), rng.integers(0, 3, k)
            next_tile += k
            a = allocate(ledger, frame, new, tex, rng.integers(0, 4, k))
            got = a.slots >= 0
            assert not set(a.evicted_tiles.tolist()) & pinned
            assert (ledger.writable_at[a.evicted_slots] == frame + fif).all()
            assert int(a.runs["count"].sum()) == int(got.sum())
            covered = np.concatenate([np.arange(r["first_slot"], r["first_slot"] + r["count"]) for r in a.runs] or [[]])
            np.testing.assert_array_equal(np.sort(covered), np.sort(a.slots[got]))
            for t in a.evicted_tiles.tolist():
                del held[t]
            held.update(zip(new[got].tolist(), tex[got].tolist(), strict=True))
            if rng.random() < 0.7:
                ledger.mark_resident(a.slots[got], frame)
        elif op == 3:
            ledger.touch(rng.integers(-1, ledger.capacity + 2, 6), frame)
        elif op == 4:
            loading = np.flatnonzero(ledger.state == CacheSlotState.LOADING)
            if loading.size:
                s = loading[: int(rng.integers(1, loading.size + 1))]
                for t in ledger.tile[s].tolist():
                    del held[t]
                    pinned.discard(t)
                ledger.free(s)
        elif op == 5:
            used = np.flatnonzero(ledger.state != CacheSlotState.FREE)
            if used.size:
                s = int(rng.choice(used))
                if rng.random() < 0.7:
                    ledger.pin(s)
                    pinned.add(int(ledger.tile[s]))
                else:
                    ledger.unpin(s)
                    pinned.discard(int(ledger.tile[s]))
        elif op == 6:
            if rng.random() < 0.5:
                tex = int(rng.integers(0, 3))
                tiles, _ = ledger.release_texture(tex, frame)
                assert set(tiles.tolist()) <= {t for t, x in held.items() if x == tex}
                for t in [t for t, x in held.items() if x == tex]:
                    del held[t]
                    pinned.discard(t)
            else:
                ev = ledger.keep_free(frame, int(rng.integers(0, ledger.capacity + 1)))
                assert not set(ev.evicted_tiles.tolist()) & pinned
                for t in ev.evicted_tiles.tolist():
                    del held[t]
        else:
            before = ledger.tile.copy()
            try:
                r = resize(ledger, cells * int(rng.integers(1, 9)), frame)
            except BudgetError:
                pass
            else:
                np.testing.assert_array_equal(ledger.tile[r.moved_to], before[r.moved_from])
                # every other held tile kept its number (the renames cover all that changed)
                stay = np.setdiff1d(np.flatnonzero(ledger.tile >= 0), r.moved_to)
                np.testing.assert_array_equal(ledger.tile[stay], before[stay])
                np.testing.assert_array_equal(r.cancelled_tiles, before[r.cancelled_slots])
                assert not set(r.evicted_tiles.tolist()) & pinned
                for t in r.evicted_tiles.tolist() + r.cancelled_tiles.tolist():
                    del held[t]
                    pinned.discard(t)
        ledger.check()
        assert set(ledger.tile[ledger.tile >= 0].tolist()) == set(held)
        assert set(ledger.tile[ledger.pinned].tolist()) == pinned
        assert ledger.used_count + ledger.free_count == ledger.capacity == len(ledger.state)


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 12).map(lambda n: 4 * n),
    uses=st.lists(st.integers(0, 30), min_size=1, max_size=48),
    shrink_to=st.integers(1, 12).map(lambda n: 4 * n),
)
def test_a_shrink_plan_keeps_the_most_recent_and_changes_nothing_until_applied(
    capacity: int, uses: list[int], shrink_to: int
) -> None:
    ledger = SlotLedger(NAME, capacity, FIF, cells=4)
    n = min(len(uses), capacity)
    slots = load(ledger, 0, np.arange(n))
    for s, f in zip(slots.tolist(), uses[:n], strict=True):
        ledger.touch(np.array([s]), f)
    if shrink_to >= capacity:
        return
    before = snapshot(ledger)
    plan = ledger.plan_shrink(shrink_to)
    assert_unchanged(ledger, before)  # planning decides, it does not move
    kept_uses = sorted(ledger.last_used[plan.survivors].tolist(), reverse=True)
    all_uses = sorted(ledger.last_used[slots].tolist(), reverse=True)
    assert kept_uses == all_uses[: len(kept_uses)]  # the most recently used survive
    assert len(plan.survivors) == min(n, shrink_to)
    ledger.apply_shrink(plan)
    ledger.check()
    assert ledger.capacity == shrink_to and ledger.resident_count == min(n, shrink_to)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_victims_among_many_equal_uses_are_the_reference_choice(weighted: bool, compiled: bool) -> None:
    """Victims when most slots share a few last-use frames (an LRU's usual shape): the longest idle
    (divided by priority), finer levels first among equals, then the lowest slots, in that order;
    the compiled candidates pass and numpy's alike."""
    loops = decider_loops()
    if compiled and loops is None:
        pytest.skip("the compiled helper is not built")
    rng = np.random.default_rng(3)
    n = 4096
    ledger = SlotLedger("pool", n, 2, cells=16)
    tex, levels = rng.integers(0, 3, n), rng.integers(0, 4, n)
    ledger.mark_resident(ledger.allocate(0, np.arange(n), tex, levels).slots, 0)
    for frame, share in ((10, 0.5), (11, 0.2), (39, 0.05)):  # a few frames touched most slots
        ledger.touch(np.flatnonzero(rng.random(n) < share), frame)
    ledger.pin(np.flatnonzero(rng.random(n) < 0.05))
    priority = np.ones(256)
    if weighted:
        priority[:3] = (1.0, 2.0, 0.5)
    ledger.weigh_by(priority if weighted else None, loops=loops.ledger if compiled and loops else None)
    frame, count = 40, 700
    last_used, pinned = ledger.last_used.copy(), ledger.pinned.copy()

    evicted = ledger.keep_free(frame, count)

    def key(slot: int) -> tuple[int, int, int]:
        idle = (frame - int(last_used[slot])) / priority[tex[slot]]
        return (-int(np.floor(idle * 16)), int(levels[slot]), slot)

    candidates = [s for s in range(n) if not pinned[s] and last_used[s] <= frame - 2]
    expect = sorted(candidates, key=key)[:count]
    assert evicted.evicted_slots.tolist() == expect
    assert evicted.evicted_tiles.tolist() == expect  # tile i was loaded into slot i


@settings(max_examples=40, deadline=None)
@given(seeds=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=40), fif=st.integers(1, 4))
def test_free_slots_go_out_lowest_writable_first_whatever_order_they_came_back(seeds: list[int], fif: int) -> None:
    """Loads freed, textures released (their slots gated) and tiles evicted ahead of demand put slots
    back on the free stack in any order; every allocation still takes the lowest writable free slots,
    then the lowest of those still waiting for draws in flight (the reference: sort the free slots)."""
    ledger = SlotLedger(NAME, 64, fif, 1)
    next_tile = 0
    for frame, seed in enumerate(seeds):
        rng = np.random.default_rng(seed)
        op = int(rng.integers(0, 4))
        if op == 0:
            free = np.flatnonzero(ledger.state == CacheSlotState.FREE)
            k = int(rng.integers(1, 12))
            order = free[np.lexsort((free, ledger.writable_at[free] > frame))]
            tex = rng.integers(0, 3, k)
            a = allocate(ledger, frame, np.arange(next_tile, next_tile + k), tex, 0)
            next_tile += k
            take = min(k, order.size)
            np.testing.assert_array_equal(a.slots[:take], order[:take])
            got = a.slots[a.slots >= 0]
            ledger.mark_resident(got[rng.random(got.size) < 0.7], frame)
        elif op == 1:
            loading = np.flatnonzero(ledger.state == CacheSlotState.LOADING)
            ledger.free(rng.permutation(loading)[: int(rng.integers(0, loading.size + 1))])
        elif op == 2:
            ledger.release_texture(int(rng.integers(0, 3)), frame)
        else:
            ledger.keep_free(frame, int(rng.integers(0, 40)))
        ledger.check()


@pytest.mark.skipif(decider_loops() is None, reason="the compiled helper is not built")
@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_candidates_pass_evicts_what_numpy_evicts(seed: int) -> None:
    """Two ledgers, one picking victims with numpy and one with the compiled pass, through the same
    random loads, uses (some past the pool, some -1), pins, releases and keep-free evictions: the same
    slots, tiles and evictions every step (weighed by priority in odd seeds); an arrival into a slot
    that is not loading is refused by both alike, with nothing written."""
    loops = decider_loops()
    assert loops is not None
    rng = np.random.default_rng(seed)
    priority = np.ones(256)
    if seed % 2:
        priority[:3] = (1.0, 3.0, 0.25)
    twins = [SlotLedger(NAME, 96, 2, 4) for _ in range(2)]
    twins[0].weigh_by(priority if seed % 2 else None)
    twins[1].weigh_by(priority if seed % 2 else None, loops=loops.ledger)
    for frame in range(60):
        op, k = int(rng.integers(0, 6)), int(rng.integers(1, 40))
        tiles, tex, levels = np.arange(frame * 40, frame * 40 + k), rng.integers(0, 3, k), rng.integers(0, 5, k)
        touched, keep = rng.integers(-1, 100, 30), int(rng.integers(0, 60))
        out = []
        for ledger in twins:
            if op <= 2:
                a = ledger.allocate(frame, tiles, tex, levels)
                ledger.mark_resident(a.slots[a.slots >= 0], frame)
                out.append((a.slots, a.evicted_tiles, a.evicted_last_used))
            elif op == 3:
                ledger.touch(touched, frame)
                ledger.pin(np.flatnonzero(ledger.state == CacheSlotState.RESIDENT)[:2])
            elif op == 4:
                e = ledger.keep_free(frame, keep)
                out.append((e.evicted_slots, e.evicted_tiles, e.evicted_last_used))
            else:
                ledger.release_texture(int(tex[0]), frame)
        if out:
            for a, b in zip(*out, strict=True):
                np.testing.assert_array_equal(a, b)
        for name in ("state", "tile", "last_used", "pinned", "writable_at"):
            np.testing.assert_array_equal(getattr(twins[0], name), getattr(twins[1], name), err_msg=name)
        twins[1].check()
    for ledger in twins:
        loading = np.flatnonzero(ledger.state == CacheSlotState.LOADING)
        not_loading = np.flatnonzero(ledger.state != CacheSlotState.LOADING)[:1]
        before = ledger.state.copy(), ledger.last_used.copy()
        with pytest.raises(ValueError, match=f"cannot mark resident slot {int(not_loading[0])} in state"):
            ledger.mark_resident(np.concatenate([loading, not_loading]), 10_000)
        np.testing.assert_array_equal(ledger.state, before[0])
        np.testing.assert_array_equal(ledger.last_used, before[1])


@pytest.mark.skipif(decider_loops() is None, reason="the compiled helper is not built")
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("count", [1, 7, 256, 4999, 20000])
def test_the_compiled_victims_are_the_smallest_documented_keys(weighted: bool, count: int) -> None:
    """The compiled pass's victims against the formula on random ledger arrays: the `count` smallest
    keys (min(floor(idle * 16), clip) * -64 + level) << 28 | slot over the evictable slots, ascending
    (all of them when fewer)."""
    loops = decider_loops()
    assert loops is not None
    rng = np.random.default_rng(count)
    n, frame, fif = 5000, 1000, 3
    state = rng.integers(0, 3, n).astype(np.uint8)
    pinned = rng.random(n) < 0.1
    last_used = rng.integers(0, frame + 1, n).astype(np.int64)
    last_used[:5] = np.iinfo(np.int64).min // 4  # never used: idle saturates
    tex, level = rng.integers(0, 4, n).astype(np.int16), rng.integers(0, 12, n).astype(np.int8)
    priority = np.ones(256)
    priority[:4] = rng.uniform(0.1, 7.0, 4) if weighted else 1.0
    out = np.empty(count, np.int64)
    clip, bits = 1 << 28, 28
    got = loops.ledger.victim_keys(
        state, pinned, last_used, tex, level, priority if weighted else None, frame, fif, clip, bits, count, out
    )
    want = np.flatnonzero((state == CacheSlotState.RESIDENT) & ~pinned & (last_used <= frame - fif))
    idle = (frame - last_used[want]).astype(np.float64) / (priority[tex[want]] if weighted else 1.0)
    key = (np.minimum(np.floor(idle * 16), clip).astype(np.int64) * -64 + level[want]) << bits | want
    np.testing.assert_array_equal(out[:got], np.sort(key)[:count])
    with pytest.raises(ValueError, match="too small"):
        loops.ledger.victim_keys(state, pinned, last_used, tex, level, None, frame, fif, clip, bits, count + 1, out)


def reference_victims(ledger: SlotLedger, frame: int, count: int, priority: np.ndarray | None) -> np.ndarray:
    """The documented order over the evictable slots: (min(floor(idle * 16), clip) * -64 + level, slot)."""
    want = np.flatnonzero(ledger.evictable_mask(frame))
    idle = (frame - ledger.last_used[want]).astype(np.float64)
    if priority is not None:
        idle /= priority[ledger.tex[want].astype(np.int64)]
    key = (np.minimum(np.floor(idle * 16), 1 << 28).astype(np.int64) * -64 + ledger.level[want]) << 28 | want
    return want[np.argsort(key)][:count]


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_victims_from_the_spares_are_those_a_new_pass_finds(seed: int, weighted: bool, compiled: bool) -> None:
    """Evictions on random traffic (uses, arrivals, pins and unpins, failed loads, a texture released,
    the pool grown): every eviction takes exactly the victims the documented order gives over the
    slots at that moment, whether they came from a pass or from the spares of an earlier one; equal
    priorities let most evictions skip the pass, a weighted pool passes every time."""
    loops = decider_loops()
    if compiled and loops is None:
        pytest.skip("the compiled helper is not built")
    rng = np.random.default_rng(seed)
    ledger = SlotLedger(NAME, 256, FIF, 1)
    priority = np.ones(256)
    if weighted:
        priority[:4] = [1.0, 2.5, 0.5, 4.0]
    ledger.weigh_by(priority, loops=loops.ledger if compiled else None)
    tile, evictions = 10_000, 0
    for frame in range(1, 200):
        resident = np.flatnonzero(ledger.state == CacheSlotState.RESIDENT)
        if resident.size:  # the view uses some slots this frame
            ledger.touch(rng.choice(resident, size=min(resident.size, int(rng.integers(0, 40)))), frame)
        roll = rng.random()
        if roll < 0.04 and (p := np.flatnonzero(ledger.pinned)).size:
            ledger.unpin(p[:1])
        elif roll < 0.08 and resident.size:
            ledger.pin(resident[:1])
        elif roll < 0.1:
            ledger.release_texture(int(rng.integers(0, 4)), frame)
        elif roll < 0.11 and ledger.capacity < 320:
            ledger.grow(ledger.capacity + 32)
        for kind in ("allocate", "keep_free"):
            n = int(rng.integers(1, 24))
            if kind == "allocate":
                expected = reference_victims(ledger, frame, max(0, n - ledger.free_count), priority)
                tex, levels = rng.integers(0, 4, n), rng.integers(0, 6, n)
                a = allocate(ledger, frame, np.arange(tile, tile + n), tex=tex, levels=levels)
                tile += n
                got = np.sort(a.evicted_slots)
                loading = a.slots[a.slots >= 0]
                fails = rng.random(loading.size) < 0.1
                ledger.free(loading[fails])
                ledger.mark_resident(loading[~fails], frame)
                np.testing.assert_array_equal(got, np.sort(expected))
            else:
                expected = reference_victims(ledger, frame, max(0, n - ledger.free_count), priority)
                got = ledger.keep_free(frame, n).evicted_slots
                np.testing.assert_array_equal(got, expected)  # best first
            evictions += expected.size > 0
        ledger.check()
    assert evictions > 100
    if weighted:
        assert ledger.victims.passes >= evictions
    else:
        assert ledger.victims.passes < evictions / 2  # most evictions took the spares
