"""Slots: content plus borders copied from the same level, resolved by the address mode."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.bake.tiler import LevelCutter, resolve
from texstream.pack import AddressMode

from . import reference as ref


def test_resolve() -> None:
    idx = np.arange(-3, 8)
    assert resolve(idx, 5, AddressMode.CLAMP).tolist() == [0, 0, 0, 0, 1, 2, 3, 4, 4, 4, 4]
    assert resolve(idx, 5, AddressMode.WRAP).tolist() == [2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2]
    with pytest.raises(ValueError, match="size"):
        resolve(idx, 0, AddressMode.CLAMP)


@pytest.mark.parametrize("mode", [AddressMode.CLAMP, AddressMode.WRAP])
@pytest.mark.parametrize(("w", "h", "t", "b"), [(20, 13, 8, 4), (16, 16, 8, 0), (5, 3, 8, 8), (1, 1, 4, 4)])
def test_slots_match_the_level_read_through_the_address_mode(mode: AddressMode, w: int, h: int, t: int, b: int) -> None:
    rng = np.random.default_rng(w * h)
    level = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    cutter = LevelCutter(w, h, t, b, mode)
    seen = set()
    for x, y, slot in cutter.cut_level(level):
        assert slot.flags.c_contiguous and slot.shape == (t + 2 * b,) * 2 + (4,)
        assert np.array_equal(slot, ref.expected_slot(level, x, y, t, b, mode is AddressMode.WRAP))
        seen.add((x, y))
    assert seen == {(x, y) for x in range(cutter.tiles_x) for y in range(cutter.tiles_y)}


def test_cutter_validates() -> None:
    with pytest.raises(ValueError, match="multiples of 4"):
        LevelCutter(10, 10, 8, 2, AddressMode.CLAMP)
    cutter = LevelCutter(10, 10, 8, 4, AddressMode.CLAMP)
    with pytest.raises(ValueError, match="tile row 2"):
        cutter.slot_rows(2)
    with pytest.raises(ValueError, match="uint8 rows"):
        next(cutter.cut(np.zeros((16, 9, 4), np.uint8)))


@pytest.mark.parametrize("mode", list(AddressMode))
def test_cut_row_is_every_slot_of_cut(mode: AddressMode) -> None:
    """The whole-row cut (a strided copy inside the level, gathers at its edges) equals `cut`,
    level widths below, at and around slot and tile multiples."""
    rng = np.random.default_rng(2)
    for width in (1, 3, 60, 64, 67, 127, 128, 136, 257):
        for tile, border in ((64, 4), (128, 0), (64, 8)):
            cutter = LevelCutter(width, 9, tile, border, mode)
            rows = rng.integers(0, 256, (cutter.slot_size, width, 4), np.uint8)
            got = cutter.cut_row(rows)
            assert got.flags.c_contiguous
            assert np.array_equal(got, np.stack([slot for _, slot in cutter.cut(rows)]))
