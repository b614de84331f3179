"""CachePool: the GL half of a cache pool. Its texture array holds exactly its budgeted bytes, and a
resize carries out its ledger's plan on the GPU (kept layers and moved cells arrive intact, nothing
changes when the budget refuses). The ledger's bookkeeping itself is tested without GL in
test_slots.py.
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
from texstream.runtime.pools import CachePool
from texstream.runtime.slots import Allocation, CacheSlotState, ResizeResult, SlotGeometry

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
    return pool.ledger.allocate(frame, tiles, tex, levels)


def load(pool: CachePool, frame: int, tiles, tex=0, levels=0) -> np.ndarray:
    """Allocate `tiles` at `frame` and make them resident; returns their slots."""
    slots = allocate(pool, frame, tiles, tex, levels).slots
    assert (slots >= 0).all()
    pool.ledger.mark_resident(slots, frame)
    return slots


def snapshot(pool: CachePool) -> dict[str, object]:
    return {
        "capacity": pool.capacity,
        "texture": pool.texture,
        "reserved": pool.budget.reserved(pool.name),
        **{
            name: getattr(pool.ledger, name).copy()
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
    _, cx, cy = (int(v) for v in g.locate(slot, pool.layers))
    return blocks[cy * per_cell : (cy + 1) * per_cell, cx * per_cell : (cx + 1) * per_cell].tobytes()


def slot_contents(gl: GLExt, pool: CachePool) -> list[bytes]:
    """Bytes of every slot of the pool's current array."""
    assert pool.texture is not None
    layers = [gl.read_layer(pool.texture, i) for i in range(pool.layers)]
    return [cell_bytes(pool, layers[s % pool.layers], s) for s in range(pool.capacity)]


# ---- construction, counts and budget --------------------------------------------------------------
def test_pool_owns_an_array_of_exactly_its_budgeted_bytes(make_pool: MakePool) -> None:
    pool = make_pool(8, index=2)
    assert pool.name == "pool/bc1-srgb/136" and pool.unit == FIRST_UNIT + 2
    assert pool.capacity == 8 and pool.layers == 8 and pool.bytes_on_gpu == 8 * 9248
    assert_budget_matches(pool)
    assert pool.budget.usage == 8 * 9248
    assert (
        pool.ledger.free_count == 8
        and pool.ledger.used_count == 0
        and pool.ledger.resident_count == 0
        and pool.ledger.pinned_count == 0
    )
    assert (pool.ledger.state == CacheSlotState.FREE).all() and (pool.ledger.tile == -1).all()
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


def test_resize_grow_keeps_contents_and_appends_free_slots(gl: GLExt, make_pool: MakePool) -> None:
    pool = make_pool(4)
    load(pool, 0, [0, 1, 2], levels=[0, 1, 2])
    pool.ledger.pin(1)
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
        np.testing.assert_array_equal(getattr(pool.ledger, name)[:4], before[name], err_msg=name)
    assert (
        (pool.ledger.state[4:] == CacheSlotState.FREE).all()
        and (pool.ledger.tile[4:] == -1).all()
        and not pool.ledger.pinned[4:].any()
    )
    assert pool.ledger.free_count == 5 and pool.ledger.pinned_count == 1
    assert slot_contents(gl, pool)[:4] == data
    np.testing.assert_array_equal(allocate(pool, 6, [10, 11, 12]).slots, [3, 4, 5])
    pool.ledger.check()


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
    pool.ledger.release_texture(1, frame=10)
    assert (pool.ledger.writable_at[:2] == 10 + FIF).all()
    pool.resize(8, frame=10)  # draws in flight sample the old array, not the new one
    assert (pool.ledger.writable_at <= 10).all()


def test_resize_shrink_keeps_mru_and_pinned_and_reports_moves(gl: GLExt, make_pool: MakePool) -> None:
    pool = make_pool(8)
    slots = load(pool, 0, np.arange(100, 108), tex=np.arange(8) % 2, levels=np.arange(8) % 3)
    uses = [3, 9, 1, 8, 2, 7, 6, 5]
    for s, f in zip(slots, uses, strict=True):
        pool.ledger.touch(np.array([s]), f)
    pool.ledger.pin([slots[2]])  # oldest, but pinned
    data = fill_layers(gl, pool, seed=2)
    r = pool.resize(4, frame=20)
    # Keep: pinned slot 2, then the most recently used: slot 1 (9), slot 3 (8), slot 5 (7).
    np.testing.assert_array_equal(np.sort(pool.ledger.resident_tile_ids()), [101, 102, 103, 105])
    np.testing.assert_array_equal(np.sort(r.evicted_tiles), [100, 104, 106, 107])
    # Slot 5 lived in a removed layer: it moves into the first freed slot of the kept layers.
    np.testing.assert_array_equal(r.moved_from, [5])
    np.testing.assert_array_equal(r.moved_to, [0])
    assert r.cancelled_tiles.size == r.cancelled_slots.size == 0
    assert (
        pool.ledger.tile[0] == 105
        and pool.ledger.tex[0] == 1
        and pool.ledger.level[0] == 2
        and pool.ledger.last_used[0] == 7
    )
    assert (
        pool.ledger.pinned[2] and pool.ledger.pinned_count == 1 and pool.capacity == 4 and pool.ledger.free_count == 0
    )
    assert_budget_matches(pool)
    assert pool.budget.usage == 4 * 9248
    # GPU: the mover's bytes arrived at its new slot; the kept layers are intact
    assert slot_contents(gl, pool) == [data[5], data[1], data[2], data[3]]
    pool.ledger.check()


def test_resize_refuses_when_pinned_tiles_do_not_fit(gl: GLExt, make_pool: MakePool) -> None:
    pool = make_pool(8)
    slots = load(pool, 0, np.arange(5), levels=3)
    pool.ledger.pin(slots)
    data = fill_layers(gl, pool, seed=3)
    before = snapshot(pool)
    with pytest.raises(BudgetError, match="5 pinned tiles"):
        pool.resize(4, frame=9)
    assert_unchanged(pool, before)
    assert slot_contents(gl, pool) == data
    pool.resize(5, frame=9)  # exactly fits
    assert pool.ledger.pinned_count == 5 and pool.ledger.resident_count == 5 and pool.ledger.free_count == 0
    assert slot_contents(gl, pool) == data[:5]
    pool.ledger.check()


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
    pool.ledger.check()


def test_resize_in_whole_layers_with_cells(gl: GLExt, make_pool: MakePool) -> None:
    pool = make_pool(12, QUAD)  # 4 cells x 3 layers; slot s is cell s // 3, layer s % 3
    slots = load(pool, 0, np.arange(100, 112))
    for i, s in enumerate(slots):
        pool.ledger.touch(np.array([s]), i)  # slot 11 most recent
    data = fill_layers(gl, pool, seed=5)
    cells = slot_contents(gl, pool)
    assert len(set(cells)) == 12  # every cell distinct
    assert [cell_bytes(pool, data[s % 3], s) for s in range(12)] == cells
    for bad in (6, 5, 0):
        with pytest.raises(ValueError, match="multiple of 4 slots"):
            pool.resize(bad, frame=20)
    r = pool.resize(4, frame=20)
    assert pool.capacity == 4 and pool.layers == 1 and pool.ledger.free_count == 0
    assert_budget_matches(pool)
    np.testing.assert_array_equal(np.sort(pool.ledger.resident_tile_ids()), [108, 109, 110, 111])
    # layer 0 of each cell stays (old slots 0, 3, 6, 9): slot 9 keeps its cell as slot 3; 8, 10, 11
    # move into the cells of the dropped 0, 3, 6, which are slots 0, 1, 2 with one layer
    assert sorted(zip(r.moved_from.tolist(), r.moved_to.tolist(), strict=True)) == [(8, 0), (9, 3), (10, 1), (11, 2)]
    np.testing.assert_array_equal(np.sort(r.evicted_tiles), np.arange(100, 108))
    # GPU: each survivor's cell arrived at its renamed slot
    got = slot_contents(gl, pool)
    for f, t in zip(r.moved_from.tolist(), r.moved_to.tolist(), strict=True):
        assert got[t] == cells[f]
    np.testing.assert_array_equal(pool.ledger.tile[r.moved_to], 100 + r.moved_from)
    pool.ledger.check()
    shrunk = got
    r = pool.resize(8, frame=21)  # 4 cells x 2 layers: old slot c is now 2c
    assert pool.layers == 2 and pool.ledger.free_count == 4
    np.testing.assert_array_equal(r.moved_from, [1, 2, 3])
    np.testing.assert_array_equal(r.moved_to, [2, 4, 6])
    assert slot_contents(gl, pool)[::2] == shrunk
    assert_budget_matches(pool)
    pool.ledger.check()


def test_resize_shrink_with_cells_moves_into_other_cells(gl: GLExt, make_pool: MakePool) -> None:
    pool = make_pool(12, QUAD)
    load(pool, 0, np.arange(12))  # tile id = slot
    pool.ledger.touch(np.array([10, 2, 11, 6]), 5)
    data = fill_layers(gl, pool, seed=6)
    cells = [cell_bytes(pool, data[s % 3], s) for s in range(12)]
    r = pool.resize(8, frame=10)
    # Keep the four used at frame 5, then the room left by the lowest of the rest (equal uses and
    # levels): 0, 1, 3, 4. Layer 2 goes (slots 2, 5, 8, 11): 2 and 11 move into the free kept slots
    # 7 and 9, then every kept slot c * 3 + l is renamed c * 2 + l.
    np.testing.assert_array_equal(np.sort(r.evicted_tiles), [5, 7, 8, 9])
    np.testing.assert_array_equal(pool.ledger.tile, [0, 1, 3, 4, 6, 2, 11, 10])
    np.testing.assert_array_equal(pool.ledger.tile[r.moved_to], r.moved_from)  # tile id = old slot
    got = slot_contents(gl, pool)
    assert got == [cells[t] for t in pool.ledger.tile.tolist()]
    assert_budget_matches(pool)
    pool.ledger.check()


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
            assert (pool.ledger.writable_at[a.evicted_slots] == frame + FIF).all()
            evicted += a.evicted_tiles.size
            for t in a.evicted_tiles.tolist():
                del held[t]
            held.update(zip(new[got].tolist(), tex[got].tolist(), strict=True))
            slots = a.slots[got]
            if slots.size and rng.random() < 0.2:
                del held[int(pool.ledger.tile[slots[0]])]
                pool.ledger.free(slots[:1])
                slots = slots[1:]
            if rng.random() < 0.8:
                pool.ledger.mark_resident(slots, frame)
        elif op == 3:
            pool.ledger.touch(rng.integers(-1, pool.capacity + 2, 6), frame)
        elif op == 4:
            loading = np.flatnonzero(pool.ledger.state == CacheSlotState.LOADING)
            if loading.size:
                pool.ledger.mark_resident(loading[: int(rng.integers(1, loading.size + 1))], frame)
        elif op == 5:
            used = np.flatnonzero(pool.ledger.state != CacheSlotState.FREE)
            if used.size:
                s = int(rng.choice(used))
                if rng.random() < 0.7:
                    pool.ledger.pin(s)
                    pinned.add(int(pool.ledger.tile[s]))
                else:
                    pool.ledger.unpin(s)
                    pinned.discard(int(pool.ledger.tile[s]))
        elif op == 6 and rng.random() < 0.3:
            tex = int(rng.integers(0, 3))
            tiles, slots = pool.ledger.release_texture(tex, frame)
            assert set(tiles.tolist()) <= {t for t, x in held.items() if x == tex}
            for t in [t for t, x in held.items() if x == tex]:
                del held[t]
                pinned.discard(t)
        elif op == 7:
            before = pool.ledger.tile.copy()
            try:
                r = pool.resize(int(rng.choice([8, 12, 16, 24])), frame)
            except BudgetError:
                refused += 1
            else:
                resized += 1
                np.testing.assert_array_equal(pool.ledger.tile[r.moved_to], before[r.moved_from])
                np.testing.assert_array_equal(r.cancelled_tiles, before[r.cancelled_slots])
                assert not set(r.evicted_tiles.tolist()) & pinned
                for t in r.evicted_tiles.tolist() + r.cancelled_tiles.tolist():
                    del held[t]
                    pinned.discard(t)
        pool.ledger.check()
        assert set(pool.ledger.tile[pool.ledger.tile >= 0].tolist()) == set(held)
        assert set(pool.ledger.tile[pool.ledger.pinned].tolist()) == pinned
        assert pool.ledger.used_count + pool.ledger.free_count == pool.capacity == len(pool.ledger.state)
        assert pool.ledger.used_count == len(held)
        assert_budget_matches(pool)
    assert evicted > 50 and resized > 10  # every kind of change happened
