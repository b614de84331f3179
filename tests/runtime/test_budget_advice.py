"""The smallest budget a BudgetError names, on the CPU: the ring's fixed point, whole pool layers,
the residency core's sums over its pools, and the open error's wording."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from texstream.config import BudgetConfig, StreamerConfig
from texstream.errors import BudgetError
from texstream.pack.format import PackHeader
from texstream.runtime.budget import BudgetManager
from texstream.runtime.budget_advice import layers_bytes, minimum_budget, open_error, pinned_tiles, ring_bytes
from texstream.runtime.residency import Residency
from texstream.runtime.slots import SlotGeometry, SlotLedger
from texstream.units import MIB

HEADER = PackHeader(width=1024, height=1024, tile_size=128)  # levels 0..3: 64, 16, 4, 1 tiles
ONE = SlotGeometry(slot_size=HEADER.slot_size, slot_bytes=HEADER.tile_raw_size)  # one slot a layer
FOUR = SlotGeometry(slot_size=HEADER.slot_size, slot_bytes=HEADER.tile_raw_size, cells_x=2, cells_y=2)


@given(
    fixed=st.integers(0, 1 << 40),
    ring_mb=st.integers(1, 4096),
    tile_bytes=st.integers(1, 1 << 22),
)
def test_minimum_budget_is_the_smallest_that_holds_its_ring(fixed: int, ring_mb: int, tile_bytes: int) -> None:
    b = minimum_budget(fixed, ring_mb=ring_mb, tile_bytes=tile_bytes)
    assert fixed + ring_bytes(ring_mb, b, tile_bytes) <= b
    assert fixed + ring_bytes(ring_mb, b - 1, tile_bytes) > b - 1  # one byte less does not fit


def test_the_ring_is_a_quarter_of_the_budget_between_its_bounds() -> None:
    assert ring_bytes(64, 100 * MIB, 1024) == 25 * MIB
    assert ring_bytes(64, 1024 * MIB, 1024) == 64 * MIB  # capped by ring_mb
    assert ring_bytes(64, 1 * MIB, 1 << 20) == 16 << 20  # at least 16 tiles
    # 30 MiB fixed + a quarter (rounded down) of 40 MiB less a byte is 40 MiB less a byte
    assert minimum_budget(30 * MIB, ring_mb=64, tile_bytes=1024) == 40 * MIB - 1


def test_pools_take_whole_layers_and_one_at_least() -> None:
    assert pinned_tiles(HEADER, 2) == 5 and pinned_tiles(HEADER, 9) == 85
    assert layers_bytes([(FOUR, 5)]) == 2 * FOUR.layer_bytes
    assert layers_bytes([(FOUR, 0), (ONE, 3)]) == FOUR.layer_bytes + 3 * ONE.layer_bytes


def core_with_one_texture() -> Residency:
    core = Residency(StreamerConfig(pinned_levels=2, ring_mb=64), BudgetManager(BudgetConfig(budget_mb=64)))
    core.register(0, HEADER)
    core.attach(0, HEADER, 0, SlotLedger("pool/test", 8, 2), ONE)
    return core


def test_the_core_sums_pinned_layers_over_its_pools() -> None:
    core = core_with_one_texture()
    slot = HEADER.tile_raw_size
    assert core.pinned_layers_bytes() == 5 * slot
    assert core.pinned_layers_bytes(full=0) == 85 * slot  # the all-resident texture counts whole
    assert core.pinned_layers_bytes((0, ONE, HEADER)) == 10 * slot  # a second texture in the same pool
    assert core.pinned_layers_bytes((-1, FOUR, HEADER)) == 5 * slot + 2 * FOUR.layer_bytes  # in a new pool
    assert core.pinned_layers_bytes((-1, FOUR, HEADER), levels=1) == slot + FOUR.layer_bytes


def test_check_room_names_the_budget_that_holds_the_whole_texture() -> None:
    core = core_with_one_texture()
    ids = core.space.tile_ids(0)
    with pytest.raises(BudgetError, match="all 85 tiles need") as info:
        core.check_room(0, ids, "terrain.tpk")
    assert info.value.minimum_bytes == minimum_budget(
        85 * HEADER.tile_raw_size, ring_mb=64, tile_bytes=HEADER.tile_raw_size
    )
    assert "set BudgetConfig.budget_mb to at least" in str(info.value)


def test_open_error_names_fewer_pinned_levels_only_where_they_save_a_mib() -> None:
    exc = BudgetError("the VRAM budget (1.0 MiB) is too small", minimum_bytes=2 * MIB)
    cheap = open_error("a.tpk", exc, lambda levels: 3 * MIB)
    assert str(cheap) == "a.tpk: the VRAM budget (1.0 MiB) is too small: set BudgetConfig.budget_mb to at least 3"
    assert not cheap.pinned_levels
    costly = open_error("a.tpk", exc, lambda levels: 3 * MIB if levels == 1 else 9 * MIB)
    assert costly.minimum_bytes == 9 * MIB and costly.pinned_levels
    assert str(costly).endswith("at least 9, or lower StreamerConfig.pinned_levels")
    bigger = BudgetError("x", minimum_bytes=12 * MIB)  # the failed allocation's own minimum is larger
    assert open_error("a.tpk", bigger, lambda levels: 3 * MIB).minimum_bytes == 12 * MIB
