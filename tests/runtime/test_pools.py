"""CachePool and plan_capacities: slot geometry, LRU eviction, pins, eviction and overwrite delays,
state checks, texture release, budget accounting, resizes (bookkeeping and GPU contents) and pool sizing.

A `CachePool` owns a real GL texture array, so these are GL tests (llvmpipe is enough). Tile and texture
ids are plain integers: the pool does not interpret them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import moderngl
import numpy as np
import pytest

from texstream.config import BudgetConfig
from texstream.errors import BudgetError
from texstream.gl.gl_ext import GLExt
from texstream.pack.format import TexelFormat
from texstream.runtime.budget import MIB, BudgetManager
from texstream.runtime.pools import (
    Allocation,
    CachePool,
    PoolDemand,
    ResizeResult,
    SlotGeometry,
    SlotState,
    plan_capacities,
)

pytestmark = pytest.mark.gl

KEY = (TexelFormat.BC1, True, 136)
GEOM = SlotGeometry(slot_size=136, slot_bytes=9248)  # one 136-texel BC1 slot per layer
QUAD = SlotGeometry(slot_size=136, slot_bytes=9248, cells_x=2, cells_y=2)  # four slots per layer
FIF = 3
FIRST_UNIT = 8

MakePool = Callable[..., CachePool]


@pytest.fixture(scope="module")
def gl(gl_context: moderngl.Context) -> GLExt:
    return GLExt(gl_context)


@pytest.fixture
def make_pool(gl: GLExt) -> Iterator[MakePool]:
    """Pools with their own 64 MiB budget (unless one is given); released at teardown."""
    pools: list[CachePool] = []

    def make(
        capacity: int = 8,
        geometry: SlotGeometry = GEOM,
        fif: int = FIF,
        budget: BudgetManager | None = None,
        index: int = 0,
    ) -> CachePool:
        pool = CachePool(
            gl,
            budget if budget is not None else BudgetManager(BudgetConfig(budget_mb=64)),
            key=KEY,
            index=index,
            geometry=geometry,
            capacity=capacity,
            frames_in_flight=fif,
            first_unit=FIRST_UNIT,
        )
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.release()


def allocate(pool: CachePool, frame: int, tiles, tex=0, levels=0) -> Allocation:
    tiles = np.asarray(tiles, np.int64).ravel()
    tex = np.broadcast_to(np.asarray(tex, np.int64), tiles.shape)
    levels = np.broadcast_to(np.asarray(levels, np.int64), tiles.shape)
    return pool.allocate(frame, tiles, tex, levels)


def load(pool: CachePool, frame: int, tiles, tex=0, levels=0) -> np.ndarray:
    """Allocate `tiles` at `frame` and make them resident; returns their slots."""
    slots = allocate(pool, frame, tiles, tex, levels).slots
    assert (slots >= 0).all()
    pool.mark_resident(slots, frame)
    return slots


def snapshot(pool: CachePool) -> dict[str, object]:
    return {
        "capacity": pool.capacity,
        "texture": pool.texture,
        "reserved": pool.budget.reserved(pool.name),
        **{
            name: getattr(pool, name).copy()
            for name in ("state", "tile", "tex", "level", "last_used", "pinned", "writable_at")
        },
    }


def assert_unchanged(pool: CachePool, before: dict[str, object]) -> None:
    after = snapshot(pool)
    for name, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(after[name], value, err_msg=name)
        else:
            assert after[name] is value or after[name] == value, name


def assert_budget_matches(pool: CachePool) -> None:
    assert pool.texture is not None
    assert pool.budget.reserved(pool.name) == pool.bytes_on_gpu == pool.texture.nbytes
    assert pool.texture.layers == pool.layers


# ---- GPU contents -----------------------------------------------------------------------------------
def fill_layers(gl: GLExt, pool: CachePool, seed: int) -> list[bytes]:
    """Distinct random bytes in every layer of the pool's array; returns them."""
    assert pool.texture is not None
    rng = np.random.default_rng(seed)
    data = []
    for layer in range(pool.layers):
        d = rng.integers(0, 256, pool.texture.layer_bytes, dtype=np.uint8).tobytes()
        gl.write_layer(pool.texture, layer, d)
        data.append(d)
    return data


def cell_bytes(pool: CachePool, layer_data: bytes, slot: int) -> bytes:
    """The BC1 blocks of slot `slot`'s cell inside the bytes of its layer (blocks in row-major order)."""
    g = pool.geometry
    per_cell = g.slot_size // 4
    width, height = (n // 4 for n in g.layer_size)
    blocks = np.frombuffer(layer_data, np.uint8).reshape(height, width, 8)
    _, cx, cy = (int(v) for v in g.locate(slot))
    return blocks[cy * per_cell : (cy + 1) * per_cell, cx * per_cell : (cx + 1) * per_cell].tobytes()


def slot_contents(gl: GLExt, pool: CachePool) -> list[bytes]:
    """Bytes of every slot of the pool's current array."""
    assert pool.texture is not None
    layers = [gl.read_layer(pool.texture, i) for i in range(pool.layers)]
    return [cell_bytes(pool, layers[s // pool.geometry.cells], s) for s in range(pool.capacity)]


# ---- geometry ----------------------------------------------------------------------------------------
def test_geometry_locate_and_rounding() -> None:
    g = SlotGeometry(slot_size=136, slot_bytes=100, cells_x=3, cells_y=3)
    assert g.cells == 9 and g.layer_size == (408, 408) and g.layer_bytes == 900
    layer, cx, cy = g.locate(np.arange(19))
    np.testing.assert_array_equal(layer, [0] * 9 + [1] * 9 + [2])
    np.testing.assert_array_equal(cx, [0, 1, 2] * 6 + [0])
    np.testing.assert_array_equal(cy, [0, 0, 0, 1, 1, 1, 2, 2, 2] * 2 + [0])
    assert [int(v) for v in g.locate(13)] == [1, 1, 1]
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


# ---- construction, counts and budget --------------------------------------------------------------
def test_pool_owns_an_array_of_exactly_its_budgeted_bytes(make_pool: MakePool) -> None:
    pool = make_pool(8, index=2)
    assert pool.name == "pool/bc1-srgb/136" and pool.unit == FIRST_UNIT + 2
    assert pool.capacity == 8 and pool.layers == 8 and pool.bytes_on_gpu == 8 * 9248
    assert_budget_matches(pool)
    assert pool.budget.usage == 8 * 9248
    assert pool.free_count == 8 and pool.used_count == 0 and pool.resident_count == 0 and pool.pinned_count == 0
    assert (pool.state == SlotState.FREE).all() and (pool.tile == -1).all()
    pool.bind()
    texture = pool.texture
    assert texture is not None
    pool.release()
    assert pool.texture is None and texture.released
    assert pool.budget.reserved(pool.name) == 0 and pool.budget.usage == 0
    pool.release()  # twice is harmless
    assert pool.budget.usage == 0


def test_pool_with_cells_budgets_whole_layers(make_pool: MakePool) -> None:
    pool = make_pool(12, QUAD)
    assert pool.layers == 3 and pool.bytes_on_gpu == 12 * 9248
    assert pool.texture is not None and pool.texture.size == 272
    assert_budget_matches(pool)


def test_non_square_cell_grids_are_refused() -> None:
    """Texture arrays are square: a grid of cells that is not cannot be laid out exactly."""
    for cx, cy in ((2, 1), (1, 3)):
        with pytest.raises(ValueError, match="square grid"):
            SlotGeometry(slot_size=136, slot_bytes=9248, cells_x=cx, cells_y=cy)


def test_pool_rejects_bad_capacity_and_frames_in_flight(gl: GLExt) -> None:
    budget = BudgetManager(BudgetConfig(budget_mb=64))

    def make(capacity: object, geometry: SlotGeometry = QUAD, fif: int = FIF) -> CachePool:
        return CachePool(gl, budget, KEY, 0, geometry, capacity, fif, FIRST_UNIT)  # type: ignore[arg-type]

    for bad in (6, 0, -4, 2, 4.0):
        with pytest.raises(ValueError, match="multiple of 4 slots"):
            make(bad)
    with pytest.raises(ValueError, match="multiple of 1 slots"):
        make(0, GEOM)
    with pytest.raises(ValueError, match="frames_in_flight"):
        make(4, fif=0)
    assert budget.usage == 0


def test_pool_over_budget_or_layer_limit_reserves_nothing(gl: GLExt, make_pool: MakePool) -> None:
    small = BudgetManager(BudgetConfig(budget_mb=10 * 9248 / MIB))
    with pytest.raises(BudgetError):
        make_pool(11, budget=small)
    assert small.usage == 0
    make_pool(10, budget=small)  # exactly the budget
    assert small.usage == small.budget
    too_many = gl.max_array_layers + 1
    big = BudgetManager(BudgetConfig(budget_mb=(too_many * 9248) / MIB + 1))
    with pytest.raises(ValueError, match="layers"):
        make_pool(too_many, budget=big)
    assert big.usage == 0


def test_counts(make_pool: MakePool) -> None:
    pool = make_pool(8)
    resident = load(pool, 0, [10, 11, 12], levels=[0, 1, 2])
    loading = allocate(pool, 0, [20, 21]).slots
    pool.pin([resident[2], loading[0]])
    assert pool.free_count == 3 and pool.used_count == 5
    assert pool.resident_count == 3 and pool.pinned_count == 2
    np.testing.assert_array_equal(pool.resident_tile_ids(), [10, 11, 12])
    np.testing.assert_array_equal(pool.level[resident], [0, 1, 2])
    assert pool.layers == 8 and pool.bytes_on_gpu == 8 * 9248
    pool.mark_resident(loading, 1)
    np.testing.assert_array_equal(pool.resident_tile_ids(), [10, 11, 12, 20, 21])
    assert pool.resident_count == 5
    pool.check()


# ---- allocation and LRU --------------------------------------------------------------------------------
def test_allocate_takes_free_slots_lowest_first(make_pool: MakePool) -> None:
    pool = make_pool(4)
    got = [int(allocate(pool, 0, [i], tex=5, levels=i).slots[0]) for i in range(3)]
    assert got == [0, 1, 2]
    a = allocate(pool, 1, [3, 4])
    np.testing.assert_array_equal(a.slots, [3, -1])  # nothing resident, nothing evictable
    assert a.slots.dtype == np.int64
    assert a.evicted_tiles.size == a.evicted_slots.size == a.evicted_last_used.size == 0
    assert (pool.state == SlotState.LOADING).all()
    np.testing.assert_array_equal(pool.tile, [0, 1, 2, 3])
    np.testing.assert_array_equal(pool.tex, [5, 5, 5, 0])
    np.testing.assert_array_equal(pool.last_used, [0, 0, 0, 1])
    assert allocate(pool, 0, []).slots.size == 0
    pool.check()


def test_freed_slots_are_reused_lowest_first(make_pool: MakePool) -> None:
    pool = make_pool(8)
    slots = allocate(pool, 0, [0, 1, 2, 3]).slots
    np.testing.assert_array_equal(slots, [0, 1, 2, 3])
    pool.free(slots[0])
    pool.free(slots[2])
    # free slots 0, 2, 4..7: the lowest come first whatever order they were freed in
    np.testing.assert_array_equal(allocate(pool, 1, [10, 11, 12]).slots, [0, 2, 4])
    pool.check()


def test_allocate_prefers_writable_lowest_free_slots_after_releases(make_pool: MakePool) -> None:
    pool = make_pool(8)
    load(pool, 0, [0, 1, 2, 3], tex=1)
    load(pool, 0, [4, 5, 6, 7], tex=2)
    pool.release_texture(1, frame=1)  # slots 0..3 writable from frame 4
    pool.release_texture(2, frame=100)  # slots 4..7 writable only from frame 103
    slots = allocate(pool, 100, [8]).slots
    assert slots.tolist() == [0], "a free, writable lower slot was passed over"
    assert pool.writable_at[slots[0]] <= 100


def test_lru_order_of_eviction(make_pool: MakePool) -> None:
    pool = make_pool(4)
    slots = load(pool, 0, [100, 101, 102, 103])
    for slot, frame in zip(slots, (7, 2, 9, 5), strict=True):
        pool.touch(np.array([slot]), frame)
    a = allocate(pool, 20, [200, 201, 202, 203], tex=1)
    np.testing.assert_array_equal(a.slots, [1, 3, 0, 2])
    np.testing.assert_array_equal(a.evicted_slots, [1, 3, 0, 2])
    np.testing.assert_array_equal(a.evicted_tiles, [101, 103, 100, 102])
    np.testing.assert_array_equal(a.evicted_last_used, [2, 5, 7, 9])
    np.testing.assert_array_equal(pool.tile[a.slots], [200, 201, 202, 203])
    assert (pool.state == SlotState.LOADING).all() and (pool.tex == 1).all()
    assert (pool.writable_at == 20 + FIF).all()  # the overwrite gate of every evicted slot
    pool.check()


def test_free_slots_before_eviction(make_pool: MakePool) -> None:
    pool = make_pool(4)
    load(pool, 0, [0, 1])
    pool.touch(np.array([0]), 5)
    a = allocate(pool, 50, [10, 11, 12])
    np.testing.assert_array_equal(a.slots, [2, 3, 1])
    np.testing.assert_array_equal(a.evicted_tiles, [1])
    np.testing.assert_array_equal(a.evicted_slots, [1])
    np.testing.assert_array_equal(a.evicted_last_used, [0])
    assert pool.writable_at[1] == 50 + FIF and pool.writable_at[2] <= 50 and pool.writable_at[3] <= 50
    pool.check()


def test_lru_ties_evict_finer_levels_first(make_pool: MakePool) -> None:
    pool = make_pool(3)
    load(pool, 0, [0, 1, 2], levels=[2, 0, 1])
    a = allocate(pool, 10, [10, 11, 12])
    np.testing.assert_array_equal(a.evicted_slots, [1, 2, 0])
    np.testing.assert_array_equal(a.evicted_tiles, [1, 2, 0])


def test_partial_eviction_picks_the_oldest_then_finest(make_pool: MakePool) -> None:
    pool = make_pool(8)
    load(pool, 0, np.arange(8), levels=[3, 1, 0, 2, 0, 1, 0, 2])
    pool.touch(np.array([6]), 4)  # a level-0 tile used later than the others
    a = allocate(pool, 10, [100, 101])
    np.testing.assert_array_equal(a.evicted_slots, [2, 4])  # level 0, last used 0; lowest slot first
    a = allocate(pool, 10, [102, 103, 104])
    np.testing.assert_array_equal(a.evicted_slots, [1, 5, 3])  # level 1, 1, then 2
    pool.check()


def test_pins_are_never_evicted(make_pool: MakePool) -> None:
    pool = make_pool(4)
    slots = load(pool, 0, [0, 1, 2, 3], levels=[5, 4, 0, 0])
    pool.pin(slots[:2])
    a = allocate(pool, 100, [10, 11, 12, 13])
    np.testing.assert_array_equal(a.slots, [slots[2], slots[3], -1, -1])
    assert pool.pinned[slots[:2]].all() and pool.pinned_count == 2
    pool.unpin(slots[0])
    assert pool.pinned_count == 1
    pool.mark_resident(a.slots[:2], 100)
    a = allocate(pool, 200, [14])
    np.testing.assert_array_equal(a.slots, [slots[0]])
    np.testing.assert_array_equal(a.evicted_tiles, [0])
    pool.check()


def test_pins_survive_random_pressure(make_pool: MakePool) -> None:
    rng = np.random.default_rng(7)
    pool = make_pool(32)
    pinned_slots = load(pool, 0, np.arange(1000, 1006), levels=9)
    pool.pin(pinned_slots)
    next_tile = 0
    evicted = 0
    for frame in range(1, 200):
        count = int(rng.integers(1, 6))
        a = allocate(pool, frame, np.arange(next_tile, next_tile + count), levels=rng.integers(0, 4, count))
        next_tile += count
        assert not set(a.evicted_tiles.tolist()) & set(range(1000, 1006))
        evicted += a.evicted_tiles.size
        pool.mark_resident(a.slots[a.slots >= 0], frame)
        pool.touch(rng.choice(32, 5), frame)
        pool.check()
    assert evicted > 100  # the pool was under pressure
    assert pool.pinned_count == 6
    np.testing.assert_array_equal(pool.tile[pinned_slots], np.arange(1000, 1006))
    assert (pool.state[pinned_slots] == SlotState.RESIDENT).all()


def test_eviction_delay_respects_frames_in_flight(make_pool: MakePool) -> None:
    pool = make_pool(2, fif=3)
    slots = load(pool, 0, [0, 1])
    pool.touch(slots, 10)
    for frame in (10, 11, 12):
        assert not pool.evictable_mask(frame).any()
        assert allocate(pool, frame, [5]).slots.tolist() == [-1], f"evicted at frame {frame}, used at 10"
    assert pool.evictable_mask(13).all()
    a = allocate(pool, 13, [5])
    assert a.slots[0] in slots.tolist() and pool.writable_at[a.slots[0]] == 16


def test_loading_slots_are_never_evicted(make_pool: MakePool) -> None:
    pool = make_pool(2)
    a, b = allocate(pool, 0, [0, 1]).slots
    assert allocate(pool, 100, [2]).slots.tolist() == [-1]
    assert not pool.evictable_mask(100).any()
    pool.mark_resident(a, 0)
    assert allocate(pool, 100, [2]).slots.tolist() == [a]
    assert pool.state[b] == SlotState.LOADING and pool.tile[b] == 1


def test_mark_resident_counts_as_a_use(make_pool: MakePool) -> None:
    pool = make_pool(2)
    a, b = allocate(pool, 5, [0, 1]).slots
    pool.mark_resident(a, 9)  # its upload was issued at frame 9: evictable from frame 12
    pool.mark_resident(b, 5)
    assert pool.last_used[a] == 9 and pool.last_used[b] == 5
    np.testing.assert_array_equal(pool.evictable_mask(4 + FIF), [False, False])
    np.testing.assert_array_equal(pool.evictable_mask(5 + FIF), [False, True])
    np.testing.assert_array_equal(pool.evictable_mask(8 + FIF), [False, True])
    np.testing.assert_array_equal(pool.evictable_mask(9 + FIF), [True, True])


def test_touch_ignores_negative_and_out_of_range_slots(make_pool: MakePool) -> None:
    pool = make_pool(4)
    s, other = load(pool, 0, [0, 1])
    pool.touch(np.array([-1, s, 4, 99, -7]), 9)
    assert pool.last_used[s] == 9 and pool.last_used[other] == 0
    pool.touch(np.array([-1, -1]), 12)
    assert pool.last_used[s] == 9 and pool.last_used[other] == 0
    pool.check()


def test_state_transitions_are_checked(make_pool: MakePool) -> None:
    pool = make_pool(4)
    s = int(allocate(pool, 0, [0]).slots[0])
    before = snapshot(pool)
    with pytest.raises(ValueError, match="cannot mark resident slot 1 in state FREE"):
        pool.mark_resident([s, 1], 0)
    with pytest.raises(ValueError, match="cannot pin slot 2 in state FREE"):
        pool.pin(2)
    with pytest.raises(ValueError, match="cannot unpin slot 3 in state FREE"):
        pool.unpin([3])
    with pytest.raises(ValueError, match="cannot free slot 1 in state FREE"):
        pool.free([1])
    with pytest.raises(ValueError, match="out of range 0..3"):
        pool.pin([4])
    with pytest.raises(ValueError, match="out of range"):
        pool.mark_resident([-1], 0)
    assert_unchanged(pool, before)  # a refused call changes nothing, not even its valid slots
    pool.pin(s)  # a LOADING slot may be pinned
    assert pool.pinned[s]
    pool.mark_resident(s, 1)
    with pytest.raises(ValueError, match=f"{pool.name}: cannot mark resident slot 0 in state RESIDENT"):
        pool.mark_resident(s, 2)
    with pytest.raises(ValueError, match="cannot free slot 0 in state RESIDENT"):
        pool.free(s)
    pool.unpin(s)
    assert not pool.pinned[s]
    pool.check()


def test_free_returns_failed_loads_at_once(make_pool: MakePool) -> None:
    pool = make_pool(2)
    a, b = allocate(pool, 0, [0, 1]).slots
    pool.pin(a)
    pool.free([a, a])  # a slot listed twice is freed once
    assert pool.state[a] == SlotState.FREE and pool.tile[a] == -1 and not pool.pinned[a]
    assert pool.free_count == 1 and pool.pinned_count == 0
    pool.check()
    assert pool.writable_at[a] <= 0  # nothing was written: no overwrite gate
    assert allocate(pool, 0, [2]).slots.tolist() == [a]
    pool.check()


def test_release_texture_cools_resident_slots(make_pool: MakePool) -> None:
    pool = make_pool(4, fif=2)
    load(pool, 0, [0, 1], tex=7)
    load(pool, 0, [2], tex=3)
    inflight = int(allocate(pool, 0, [5], tex=7).slots[0])
    pool.pin([0, inflight])
    pool.touch(np.array([2]), 20)  # the other texture's tile stays in use
    tiles, slots = pool.release_texture(7, frame=10)
    np.testing.assert_array_equal(tiles, [5])
    np.testing.assert_array_equal(slots, [inflight])
    assert pool.used_count == 1 and pool.free_count == 3 and pool.pinned_count == 0
    assert (pool.state[[0, 1, inflight]] == SlotState.FREE).all() and (pool.tile[[0, 1, inflight]] == -1).all()
    assert pool.tile[2] == 2 and pool.state[2] == SlotState.RESIDENT and pool.tex[2] == 3
    # slots that held tiles wait for the frames in flight; the loading one had nothing written into it
    np.testing.assert_array_equal(pool.writable_at[[0, 1]], [12, 12])
    assert pool.writable_at[inflight] <= 10
    pool.check()
    empty_tiles, empty_slots = pool.release_texture(7, frame=11)
    assert empty_tiles.size == empty_slots.size == 0


# ---- resize -----------------------------------------------------------------------------------------
def test_resize_grow_keeps_contents_and_appends_free_slots(gl: GLExt, make_pool: MakePool) -> None:
    pool = make_pool(4)
    load(pool, 0, [0, 1, 2], levels=[0, 1, 2])
    pool.pin(1)
    data = fill_layers(gl, pool, seed=1)
    old_texture = pool.texture
    before = snapshot(pool)
    r = pool.resize(8, frame=5)
    assert isinstance(r, ResizeResult)
    for arr in (r.moved_from, r.moved_to, r.evicted_tiles, r.cancelled_tiles, r.cancelled_slots):
        assert arr.size == 0
    assert pool.capacity == 8 and pool.layers == 8 and pool.bytes_on_gpu == 8 * 9248
    assert pool.texture is not old_texture and old_texture is not None and old_texture.released
    assert_budget_matches(pool)
    assert pool.budget.usage == 8 * 9248
    for name in ("state", "tile", "tex", "level", "last_used", "pinned"):
        np.testing.assert_array_equal(getattr(pool, name)[:4], before[name], err_msg=name)
    assert (pool.state[4:] == SlotState.FREE).all() and (pool.tile[4:] == -1).all() and not pool.pinned[4:].any()
    assert pool.free_count == 5 and pool.pinned_count == 1
    assert slot_contents(gl, pool)[:4] == data
    np.testing.assert_array_equal(allocate(pool, 6, [10, 11, 12]).slots, [3, 4, 5])
    pool.check()


def test_resize_to_the_same_capacity_does_nothing(make_pool: MakePool) -> None:
    pool = make_pool(4)
    load(pool, 0, [0, 1])
    before = snapshot(pool)
    r = pool.resize(4, frame=1)
    assert r.moved_from.size == r.evicted_tiles.size == r.cancelled_tiles.size == 0
    assert_unchanged(pool, before)


def test_resize_opens_a_fresh_array_without_overwrite_gates(make_pool: MakePool) -> None:
    pool = make_pool(4)
    load(pool, 0, [0, 1], tex=1)
    pool.release_texture(1, frame=10)
    assert (pool.writable_at[:2] == 10 + FIF).all()
    pool.resize(8, frame=10)  # draws in flight sample the old array, not the new one
    assert (pool.writable_at <= 10).all()


def test_resize_shrink_keeps_mru_and_pinned_and_reports_moves(gl: GLExt, make_pool: MakePool) -> None:
    pool = make_pool(8)
    slots = load(pool, 0, np.arange(100, 108), tex=np.arange(8) % 2, levels=np.arange(8) % 3)
    uses = [3, 9, 1, 8, 2, 7, 6, 5]
    for s, f in zip(slots, uses, strict=True):
        pool.touch(np.array([s]), f)
    pool.pin([slots[2]])  # oldest, but pinned
    data = fill_layers(gl, pool, seed=2)
    r = pool.resize(4, frame=20)
    # Keep: pinned slot 2, then the most recently used: slot 1 (9), slot 3 (8), slot 5 (7).
    np.testing.assert_array_equal(np.sort(pool.resident_tile_ids()), [101, 102, 103, 105])
    np.testing.assert_array_equal(np.sort(r.evicted_tiles), [100, 104, 106, 107])
    # Slot 5 lived in a removed layer: it moves into the first freed slot of the kept layers.
    np.testing.assert_array_equal(r.moved_from, [5])
    np.testing.assert_array_equal(r.moved_to, [0])
    assert r.cancelled_tiles.size == r.cancelled_slots.size == 0
    assert pool.tile[0] == 105 and pool.tex[0] == 1 and pool.level[0] == 2 and pool.last_used[0] == 7
    assert pool.pinned[2] and pool.pinned_count == 1 and pool.capacity == 4 and pool.free_count == 0
    assert_budget_matches(pool)
    assert pool.budget.usage == 4 * 9248
    # GPU: the mover's bytes arrived at its new slot; the kept layers are intact
    assert slot_contents(gl, pool) == [data[5], data[1], data[2], data[3]]
    pool.check()


def test_resize_shrink_keeps_coarser_levels_among_equal_uses(make_pool: MakePool) -> None:
    pool = make_pool(4)
    load(pool, 0, [0, 1, 2, 3], levels=[0, 2, 1, 3])
    r = pool.resize(2, frame=1)
    np.testing.assert_array_equal(np.sort(pool.resident_tile_ids()), [1, 3])
    np.testing.assert_array_equal(np.sort(r.evicted_tiles), [0, 2])
    np.testing.assert_array_equal(r.moved_from, [3])
    np.testing.assert_array_equal(r.moved_to, [0])
    pool.check()


def test_resize_shrink_cancels_loading_slots_in_removed_layers(make_pool: MakePool) -> None:
    pool = make_pool(4)
    load(pool, 0, [0])
    allocate(pool, 0, [1, 2, 3])  # slot 1 LOADING in a kept layer: stays; slots 2, 3 in removed layers
    pool.pin(3)
    r = pool.resize(2, frame=1)
    np.testing.assert_array_equal(r.cancelled_tiles, [2, 3])
    np.testing.assert_array_equal(r.cancelled_slots, [2, 3])
    assert r.moved_from.size == r.evicted_tiles.size == 0
    assert pool.state.tolist() == [SlotState.RESIDENT, SlotState.LOADING]
    np.testing.assert_array_equal(pool.tile, [0, 1])
    assert pool.pinned_count == 0 and pool.free_count == 0
    pool.check()


def test_resize_shrink_keeps_loading_slots_of_kept_layers_before_recent_tiles(make_pool: MakePool) -> None:
    pool = make_pool(4)
    allocate(pool, 0, [0])  # slot 0: LOADING since frame 0
    load(pool, 0, [1, 2, 3])
    pool.touch(np.array([1, 2, 3]), 50)
    r = pool.resize(2, frame=60)
    assert pool.state.tolist() == [SlotState.LOADING, SlotState.RESIDENT]
    np.testing.assert_array_equal(pool.tile, [0, 1])
    np.testing.assert_array_equal(np.sort(r.evicted_tiles), [2, 3])
    assert r.cancelled_tiles.size == r.moved_from.size == 0
    pool.check()


def test_resize_refuses_when_pinned_tiles_do_not_fit(gl: GLExt, make_pool: MakePool) -> None:
    pool = make_pool(8)
    slots = load(pool, 0, np.arange(5), levels=3)
    pool.pin(slots)
    data = fill_layers(gl, pool, seed=3)
    before = snapshot(pool)
    with pytest.raises(BudgetError, match="5 pinned tiles"):
        pool.resize(4, frame=9)
    assert_unchanged(pool, before)
    assert slot_contents(gl, pool) == data
    pool.resize(5, frame=9)  # exactly fits
    assert pool.pinned_count == 5 and pool.resident_count == 5 and pool.free_count == 0
    assert slot_contents(gl, pool) == data[:5]
    pool.check()


def test_resize_refuses_when_pinned_plus_kept_loading_do_not_fit(make_pool: MakePool) -> None:
    pool = make_pool(4)
    loading = allocate(pool, 0, [0, 1]).slots  # slots 0, 1: LOADING in the layers a shrink keeps
    pinned = load(pool, 0, [2, 3])
    pool.pin(pinned)
    before = snapshot(pool)
    for capacity in (2, 3):
        with pytest.raises(BudgetError, match="2 pinned tiles plus 2 loading slots"):
            pool.resize(capacity, frame=5)
        assert_unchanged(pool, before)
    pool.mark_resident(loading, 1)  # now only the pinned tiles must stay
    r = pool.resize(2, frame=5)
    np.testing.assert_array_equal(r.moved_from, [2, 3])
    np.testing.assert_array_equal(r.moved_to, [0, 1])
    np.testing.assert_array_equal(np.sort(r.evicted_tiles), [0, 1])
    np.testing.assert_array_equal(pool.tile, [2, 3])
    assert pool.pinned.all()
    pool.check()


def test_resize_over_budget_changes_nothing(gl: GLExt, make_pool: MakePool) -> None:
    budget = BudgetManager(BudgetConfig(budget_mb=6 * 9248 / MIB))
    pool = make_pool(4, budget=budget)
    load(pool, 0, [0, 1, 2])
    data = fill_layers(gl, pool, seed=4)
    before = snapshot(pool)
    with pytest.raises(BudgetError):
        pool.resize(8, frame=1)
    assert_unchanged(pool, before)
    assert budget.usage == 4 * 9248 and budget.reserved(pool.name) == 4 * 9248
    assert pool.texture is not None and not pool.texture.released
    assert slot_contents(gl, pool) == data
    pool.resize(6, frame=1)  # exactly the budget
    assert budget.usage == budget.budget
    assert slot_contents(gl, pool)[:4] == data
    pool.check()


def test_resize_in_whole_layers_with_cells(gl: GLExt, make_pool: MakePool) -> None:
    pool = make_pool(12, QUAD)
    slots = load(pool, 0, np.arange(100, 112))
    for i, s in enumerate(slots):
        pool.touch(np.array([s]), i)  # slot 11 most recent
    data = fill_layers(gl, pool, seed=5)
    cells = slot_contents(gl, pool)
    assert len(set(cells)) == 12  # every cell distinct
    assert [cell_bytes(pool, data[s // 4], s) for s in range(12)] == cells
    for bad in (6, 5, 0):
        with pytest.raises(ValueError, match="multiple of 4 slots"):
            pool.resize(bad, frame=20)
    r = pool.resize(4, frame=20)
    assert pool.capacity == 4 and pool.layers == 1 and pool.free_count == 0
    assert_budget_matches(pool)
    np.testing.assert_array_equal(np.sort(pool.resident_tile_ids()), [108, 109, 110, 111])
    np.testing.assert_array_equal(r.moved_from, [8, 9, 10, 11])
    np.testing.assert_array_equal(r.moved_to, [0, 1, 2, 3])
    np.testing.assert_array_equal(np.sort(r.evicted_tiles), np.arange(100, 108))
    # GPU: each mover's cell arrived at its new cell
    assert slot_contents(gl, pool) == [cells[f] for f in r.moved_from.tolist()]
    pool.check()
    pool.resize(8, frame=21)
    assert pool.layers == 2 and pool.free_count == 4
    assert slot_contents(gl, pool)[:4] == [cells[f] for f in range(8, 12)]
    assert_budget_matches(pool)
    pool.check()


def test_resize_shrink_with_cells_moves_into_other_cells(gl: GLExt, make_pool: MakePool) -> None:
    pool = make_pool(12, QUAD)
    load(pool, 0, np.arange(12))  # tile id = slot
    pool.touch(np.array([10, 2, 11, 6]), 5)
    data = fill_layers(gl, pool, seed=6)
    cells = [cell_bytes(pool, data[s // 4], s) for s in range(12)]
    r = pool.resize(8, frame=10)
    # Keep the four used at frame 5, then the room left by the lowest of the rest (equal uses and levels):
    # 0, 1, 3, 4. Slots 10 and 11 of the removed layer move into the free cells 5 and 7 of layer 1.
    np.testing.assert_array_equal(np.sort(r.evicted_tiles), [5, 7, 8, 9])
    np.testing.assert_array_equal(r.moved_from, [10, 11])
    np.testing.assert_array_equal(r.moved_to, [5, 7])
    np.testing.assert_array_equal(pool.tile, [0, 1, 2, 3, 4, 10, 6, 11])
    got = slot_contents(gl, pool)
    assert got == [cells[t] for t in pool.tile.tolist()]
    assert_budget_matches(pool)
    pool.check()


# ---- randomized operations -----------------------------------------------------------------------------
def test_random_operations_keep_pool_consistent(make_pool: MakePool) -> None:
    """Random allocate/free/mark_resident/touch/pin/release/resize against a model of which tiles the pool
    holds: every tile that leaves is reported (evicted, freed, released or cancelled), pins never leave
    except with their texture or a cancelled load, and `check()` holds throughout."""
    rng = np.random.default_rng(3)
    pool = make_pool(16)
    held: dict[int, int] = {}  # tile -> texture, every tile the pool holds
    pinned: set[int] = set()
    next_tile = 0
    evicted = resized = refused = 0
    for frame in range(400):
        op = int(rng.integers(0, 8))
        if op <= 2:
            k = int(rng.integers(1, 6))
            new, tex = np.arange(next_tile, next_tile + k), rng.integers(0, 3, k)
            next_tile += k
            a = allocate(pool, frame, new, tex, rng.integers(0, 4, k))
            got = a.slots >= 0
            assert not set(a.evicted_tiles.tolist()) & pinned
            assert (pool.writable_at[a.evicted_slots] == frame + FIF).all()
            evicted += a.evicted_tiles.size
            for t in a.evicted_tiles.tolist():
                del held[t]
            held.update(zip(new[got].tolist(), tex[got].tolist(), strict=True))
            slots = a.slots[got]
            if slots.size and rng.random() < 0.2:
                del held[int(pool.tile[slots[0]])]
                pool.free(slots[:1])
                slots = slots[1:]
            if rng.random() < 0.8:
                pool.mark_resident(slots, frame)
        elif op == 3:
            pool.touch(rng.integers(-1, pool.capacity + 2, 6), frame)
        elif op == 4:
            loading = np.flatnonzero(pool.state == SlotState.LOADING)
            if loading.size:
                pool.mark_resident(loading[: int(rng.integers(1, loading.size + 1))], frame)
        elif op == 5:
            used = np.flatnonzero(pool.state != SlotState.FREE)
            if used.size:
                s = int(rng.choice(used))
                if rng.random() < 0.7:
                    pool.pin(s)
                    pinned.add(int(pool.tile[s]))
                else:
                    pool.unpin(s)
                    pinned.discard(int(pool.tile[s]))
        elif op == 6 and rng.random() < 0.3:
            tex = int(rng.integers(0, 3))
            tiles, slots = pool.release_texture(tex, frame)
            assert set(tiles.tolist()) <= {t for t, x in held.items() if x == tex}
            for t in [t for t, x in held.items() if x == tex]:
                del held[t]
                pinned.discard(t)
        elif op == 7:
            before = pool.tile.copy()
            try:
                r = pool.resize(int(rng.choice([8, 12, 16, 24])), frame)
            except BudgetError:
                refused += 1
            else:
                resized += 1
                np.testing.assert_array_equal(pool.tile[r.moved_to], before[r.moved_from])
                np.testing.assert_array_equal(r.cancelled_tiles, before[r.cancelled_slots])
                assert not set(r.evicted_tiles.tolist()) & pinned
                for t in r.evicted_tiles.tolist() + r.cancelled_tiles.tolist():
                    del held[t]
                    pinned.discard(t)
        pool.check()
        assert set(pool.tile[pool.tile >= 0].tolist()) == set(held)
        assert set(pool.tile[pool.pinned].tolist()) == pinned
        assert pool.used_count + pool.free_count == pool.capacity == len(pool.state)
        assert pool.used_count == len(held)
        assert_budget_matches(pool)
    assert evicted > 50 and resized > 10  # every kind of change happened


# ---- plan_capacities -------------------------------------------------------------------------------------
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
    """A pool whose pinned tiles exceed its share takes them from the others' shares."""
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


def test_keep_free_evicts_lru_tiles_ahead_of_demand(make_pool: MakePool) -> None:
    """keep_free tops the free slots up to a count by evicting least recently used, unpinned tiles
    unused for frames_in_flight frames; their slots pass the overwrite gate frames_in_flight later."""
    pool = make_pool(8)
    slots = pool.allocate(0, np.arange(8), np.zeros(8), np.zeros(8)).slots
    pool.mark_resident(slots, 0)
    pool.touch(slots[4:], 5)  # tiles 4..7 used recently
    pool.pin(slots[0])
    assert len(pool.keep_free(6, 0).evicted_tiles) == 0  # nothing asked
    ev = pool.keep_free(6, 3)
    assert sorted(ev.evicted_tiles.tolist()) == [1, 2, 3] and (ev.evicted_last_used == 0).all()
    assert pool.free_count == 3 and pool.resident_count == 5
    assert (pool.writable_at[ev.evicted_slots] == 6 + FIF).all()
    assert len(pool.keep_free(6, 3).evicted_tiles) == 0  # already free enough
    more = pool.keep_free(6, 8)  # tiles 4..7 are too recent and tile 0 is pinned: none can go
    assert len(more.evicted_tiles) == 0
    got = pool.allocate(6, np.array([10]), np.array([0]), np.array([0])).slots
    assert got[0] in ev.evicted_slots.tolist()  # a free slot, no eviction on demand
    pool.check()
