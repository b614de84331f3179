"""PageTable: nearest-resident-ancestor fallback against a brute-force reference, dirty rects, GPU data."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from texstream.pack.format import PackHeader
from texstream.runtime.page_table import GPU_NONE, NO_LEVEL, NO_SLOT, PageTable
from texstream.runtime.tile_cache import SlotGeometry


def header(w: int, h: int, t: int = 64) -> PackHeader:
    return PackHeader(width=w, height=h, tile_size=t)


def reference(table: PageTable, own: dict[tuple[int, int, int], int]) -> tuple[list, list]:
    """Brute force: per level a 2-D list of (slot, level) found by walking up the ancestors."""
    slots, levels = [], []
    for k in range(table.level_count):
        tx, ty = table.header.tiles_in_level(k)
        s = np.full((ty, tx), NO_SLOT)
        r = np.full((ty, tx), NO_LEVEL)
        for y in range(ty):
            for x in range(tx):
                for up in range(k, table.level_count):
                    hit = own.get((up, x >> (up - k), y >> (up - k)))
                    if hit is not None:
                        s[y, x], r[y, x] = hit, up
                        break
        slots.append(s)
        levels.append(r)
    return slots, levels


def assert_matches(table: PageTable, own: dict[tuple[int, int, int], int]) -> None:
    slots, levels = reference(table, own)
    for k in range(table.level_count):
        data = table.as_texture_data(k)
        none = slots[k] < 0
        np.testing.assert_array_equal(data[..., 0], np.where(none, GPU_NONE, slots[k]), err_msg=f"level {k}")
        np.testing.assert_array_equal(data[..., 1], np.where(none, GPU_NONE, levels[k]), err_msg=f"level {k}")
    table.validate()


def all_tiles(table: PageTable) -> list[tuple[int, int, int]]:
    out = []
    for k in range(table.level_count):
        tx, ty = table.header.tiles_in_level(k)
        out += [(k, x, y) for y in range(ty) for x in range(tx)]
    return out


def pin(table: PageTable, own: dict, first_slot: int = 1000) -> None:
    lv, xs, ys = table.pinned_tiles()
    for i, (k, x, y) in enumerate(zip(lv.tolist(), xs.tolist(), ys.tolist(), strict=True)):
        table.set_resident(k, x, y, first_slot + i)
        own[(k, x, y)] = first_slot + i


def test_empty_table_maps_nothing() -> None:
    t = PageTable(header(1000, 700), pinned_levels=2)
    assert not t.is_complete and t.resident_count == 0
    d = t.as_texture_data(0)
    assert d.shape == (11, 16, 4) and d.dtype == np.uint16
    assert (d[..., :2] == GPU_NONE).all() and (d[..., 2:] == 0).all()


def test_pinned_tiles_are_the_coarsest_levels() -> None:
    t = PageTable(header(1000, 700), pinned_levels=2)  # levels 16x11, 8x6, 4x3, 2x2, 1x1
    lv, x, y = t.pinned_tiles()
    assert lv.tolist() == [4, 3, 3, 3, 3] and list(zip(x.tolist(), y.tolist(), strict=True))[1:] == [
        (0, 0), (1, 0), (0, 1), (1, 1)]  # fmt: skip
    assert PageTable(header(100, 100), pinned_levels=5).pinned_levels == 2  # clamped to the level count
    with pytest.raises(ValueError, match="pinned_levels"):
        PageTable(header(100, 100), pinned_levels=0)


def test_coarsest_resident_makes_every_page_map() -> None:
    t = PageTable(header(1000, 700), pinned_levels=1)
    t.set_resident(4, 0, 0, 7)
    assert t.is_complete
    for k in range(t.level_count):
        d = t.as_texture_data(k)
        assert (d[..., 0] == 7).all() and (d[..., 1] == 4).all()
    t.validate()


@pytest.mark.parametrize(
    ("w", "h", "seed"),
    [
        (1000, 700, 0),
        (64 * 13 + 5, 64 * 7 - 3, 1),
        (4096, 4096, 2),
        (70, 3000, 3),
        (200, 64, 4),
        (2000, 130, 5),
    ],
)
def test_random_arrivals_and_evictions_match_brute_force(w: int, h: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = PageTable(header(w, h), pinned_levels=1)
    own: dict[tuple[int, int, int], int] = {}
    tiles = all_tiles(t)
    pinned_level = t.top_level
    free_tiles = [tl for tl in tiles if tl[0] != pinned_level]
    order = rng.permutation(len(free_tiles))
    # Before the pinned tile arrives pages may map to nothing; afterwards every page maps.
    for step, i in enumerate(order[: len(order) // 2]):
        tile = free_tiles[i]
        t.set_resident(*tile, slot=step)
        own[tile] = step
    assert_matches(t, own)
    pin(t, own)
    assert_matches(t, own)
    slot = 5000
    for _ in range(300):
        tile = free_tiles[int(rng.integers(len(free_tiles)))]
        if tile in own and rng.random() < 0.55:
            assert t.set_absent(*tile)
            del own[tile]
        else:
            t.set_resident(*tile, slot=slot)  # arrival, or a move to a new slot
            own[tile] = slot
            slot += 1
        assert (t.as_texture_data(0)[..., 0] != GPU_NONE).all()
    assert_matches(t, own)
    assert t.resident_count == len(own)
    # Evict everything unpinned in random order: all pages fall back to the pinned tile.
    for tile in [tl for tl in list(own) if tl[0] != pinned_level]:
        t.set_absent(*tile)
        del own[tile]
    assert_matches(t, own)


def test_lookups_are_vectorized_and_checked() -> None:
    t = PageTable(header(1000, 700), pinned_levels=1)
    t.set_resident(4, 0, 0, 9)
    t.set_resident(1, 2, 1, 3)
    lv, x, y = np.array([0, 0, 1, 3]), np.array([4, 0, 2, 0]), np.array([2, 0, 1, 0])
    np.testing.assert_array_equal(t.resident_levels(lv, x, y), [1, 4, 1, 4])
    np.testing.assert_array_equal(t.slots_at(lv, x, y), [3, 9, 3, 9])
    np.testing.assert_array_equal(t.is_resident(lv, x, y), [False, False, True, False])
    np.testing.assert_array_equal(t.contains(np.array([0, 0, 5, -1]), np.array([15, 16, 0, 0]), np.zeros(4)),
                                  [True, False, False, False])  # fmt: skip
    with pytest.raises(ValueError, match=r"\(0, 16, 0\) is outside"):
        t.slots_at(np.array([0]), np.array([16]), np.array([0]))
    assert sorted(t.used_slots(np.array([0]), np.array([4]), np.array([2]), coarser=2).tolist()) == [3, 9]
    assert t.own_slot(1, 2, 1) == 3 and t.own_slot(0, 0, 0) == NO_SLOT
    lv, x, y, s = t.resident_tiles()
    assert sorted(zip(lv.tolist(), x.tolist(), y.tolist(), s.tolist(), strict=True)) == [
        (1, 2, 1, 3),
        (4, 0, 0, 9),
    ]


def test_bad_updates_raise() -> None:
    t = PageTable(header(1000, 700), pinned_levels=2)
    with pytest.raises(ValueError, match="level 5"):
        t.set_resident(5, 0, 0, 1)
    with pytest.raises(ValueError, match=r"tile \(16, 0\) is outside level 0's 16x11"):
        t.set_resident(0, 16, 0, 1)
    with pytest.raises(ValueError, match="slot must be"):
        t.set_resident(0, 0, 0, -1)
    with pytest.raises(ValueError, match="level 3 is pinned"):
        t.set_absent(3, 0, 0)
    assert t.set_absent(0, 0, 0) is False  # not resident: no-op
    with pytest.raises(ValueError, match="16-bit"):
        t.set_resident(0, 0, 0, 0xFFFF)


def snapshot(t: PageTable) -> list[np.ndarray]:
    return [t.as_texture_data(k).copy() for k in range(t.level_count)]


def changed_pages(before: list[np.ndarray], after: list[np.ndarray]) -> set[tuple[int, int, int]]:
    out = set()
    for k, (a, b) in enumerate(zip(before, after, strict=True)):
        ys, xs = np.nonzero((a != b).any(axis=-1))
        out |= {(k, int(x), int(y)) for x, y in zip(xs, ys, strict=True)}
    return out


def covered_pages(t: PageTable) -> set[tuple[int, int, int]]:
    return {
        (k, x, y) for k, (x0, y0, x1, y1) in t.dirty_rects() for y in range(y0, y1) for x in range(x0, x1)
    }


def test_dirty_rects_with_page_blocks_are_exact() -> None:
    t = PageTable(header(1000, 700), pinned_levels=1, dirty_block=1)
    assert covered_pages(t) == set(all_tiles(t))  # a new table: everything
    t.set_resident(4, 0, 0, 1)
    t.take_dirty()
    assert t.dirty_rects() == []
    t.set_resident(2, 1, 1, 2)  # level 2 tile covers level-1 pages 2..3, level-0 pages 4..7
    assert sorted(t.dirty_rects()) == [(0, (4, 4, 8, 8)), (1, (2, 2, 4, 4)), (2, (1, 1, 2, 2))]
    for level, (x0, y0, x1, y1), data in t.take_dirty():
        np.testing.assert_array_equal(data, t.as_texture_data(level)[y0:y1, x0:x1])
    t.set_resident(0, 5, 5, 3)  # a finer tile: only its own page changes
    assert t.dirty_rects() == [(0, (5, 5, 6, 6))]
    t.take_dirty()
    t.set_resident(2, 3, 2, 5)  # level-2 edge tile: level-0 pages 12..15 x 8..10 (the grid is 16x11)
    assert (0, (12, 8, 16, 11)) in t.dirty_rects()
    t.take_dirty()
    before = snapshot(t)
    t.set_absent(2, 1, 1)  # its pages, all but (5, 5), fall back to level 4
    assert changed_pages(before, snapshot(t)) == covered_pages(t) - {(0, 5, 5)}


def test_dirty_rects_cover_every_change() -> None:
    rng = np.random.default_rng(9)
    for block in (1, 3, 16):
        t = PageTable(header(1500, 900), pinned_levels=1, dirty_block=block)
        t.set_resident(t.top_level, 0, 0, 0)
        t.take_dirty()
        tiles = all_tiles(t)[:-1]
        own: set = set()
        for step in range(80):
            before = snapshot(t)
            tile = tiles[int(rng.integers(len(tiles)))]
            if tile in own and rng.random() < 0.5:
                t.set_absent(*tile)
                own.discard(tile)
            else:
                t.set_resident(*tile, slot=step + 1)
                own.add(tile)
            assert changed_pages(before, snapshot(t)) <= covered_pages(t)
            if rng.random() < 0.5:
                t.take_dirty()


def test_scattered_changes_upload_small_regions() -> None:
    t = PageTable(header(4096, 4096), pinned_levels=1)  # level 0 is 64x64 pages; 16-page blocks
    t.set_resident(t.top_level, 0, 0, 0)
    t.take_dirty()
    for i, (x, y) in enumerate(((1, 1), (60, 60), (20, 3))):
        t.set_resident(0, x, y, 5 + i)
    assert sorted(r for k, r in t.dirty_rects() if k == 0) == [(0, 0, 32, 16), (48, 48, 64, 64)]
    t.take_dirty()
    t.set_resident(2, 0, 0, 9)  # level-0 pages 0..3 x 0..3: block (0, 0)
    t.set_resident(1, 0, 8, 10)  # level-0 pages 0..1 x 16..17: block (0, 1)
    assert [r for k, r in t.dirty_rects() if k == 0] == [(0, 0, 16, 32)]  # merged vertically


def test_dirty_rect_upload_reproduces_the_table() -> None:
    """Applying only the dirty uploads to a mirror keeps it equal to the full table."""
    rng = np.random.default_rng(5)
    t = PageTable(header(1500, 900), pinned_levels=1)
    mirror = [np.zeros_like(t.as_texture_data(k)) for k in range(t.level_count)]
    tiles = all_tiles(t)
    own: set = set()
    for step in range(200):
        tile = tiles[int(rng.integers(len(tiles)))]
        if tile[0] == t.top_level or tile not in own or rng.random() < 0.6:
            t.set_resident(*tile, slot=step)
            own.add(tile)
        else:
            t.set_absent(*tile)
            own.discard(tile)
        if step % 7 == 0:
            for level, (x0, y0, x1, y1), data in t.take_dirty():
                mirror[level][y0:y1, x0:x1] = data
    for level, (x0, y0, x1, y1), data in t.take_dirty():
        mirror[level][y0:y1, x0:x1] = data
    for k in range(t.level_count):
        np.testing.assert_array_equal(mirror[k], t.as_texture_data(k))


def test_texture_data_channels_with_cells_per_layer() -> None:
    g = SlotGeometry(slot_size=72, slot_bytes=2592, cells_x=4, cells_y=2)
    t = PageTable(header(1000, 700), pinned_levels=1, geometry=g)
    t.set_resident(4, 0, 0, 8 * 3 + 6)  # layer 3, cell (2, 1)
    t.set_resident(0, 1, 0, 5)  # layer 0, cell (1, 1)
    d = t.as_texture_data(0)
    assert d[0, 0].tolist() == [3, 4, 2, 1]
    assert d[0, 1].tolist() == [0, 0, 1, 1]
    assert t.as_texture_data(0, (1, 0, 3, 2)).shape == (2, 2, 4)
    with pytest.raises(ValueError, match="rectangle"):
        t.as_texture_data(0, (0, 0, 17, 1))


@pytest.mark.parametrize(
    ("w", "h", "t"),
    [(1000, 700, 64), (65536, 65536, 64), (5 * 64, 64, 64), (3000, 17, 128), (64, 64, 64), (100000, 3, 256)],
)
def test_gpu_mip_chain_holds_every_level(w: int, h: int, t: int) -> None:
    hd = header(w, h, t)
    pt = PageTable(hd, pinned_levels=1)
    gw, gh = pt.gpu_texture_size
    assert gw & (gw - 1) == 0 and gh & (gh - 1) == 0
    assert pt.gpu_level_count == hd.level_count
    total = 0
    for k in range(hd.level_count):
        lw, lh = pt.gpu_level_size(k)
        tx, ty = hd.tiles_in_level(k)
        assert lw >= tx and lh >= ty and (lw, lh) == (max(1, gw >> k), max(1, gh >> k))
        total += lw * lh * 8
    assert pt.bytes_on_gpu == total


def test_move_slots_renames_after_resize() -> None:
    t = PageTable(header(1000, 700), pinned_levels=1)
    t.set_resident(4, 0, 0, 10)
    t.set_resident(1, 0, 0, 11)
    t.set_resident(0, 3, 3, 12)
    t.take_dirty()
    changed = t.move_slots(np.array([11, 10]), np.array([2, 1]))
    assert changed == t.header.tile_count - 1  # every page but (0, 3, 3) sampled slot 10 or 11
    own = {(4, 0, 0): 1, (1, 0, 0): 2, (0, 3, 3): 12}
    assert_matches(t, own)
    assert t.own_slot(1, 0, 0) == 2 and {k for k, _ in t.dirty_rects()} == set(range(t.level_count))


# Hypothesis: any sequence of arrivals and evictions on a small texture matches the brute force.
SMALL = header(300, 200)  # pages 5x4, 3x2, 2x1, 1x1


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.integers(0, 2), st.integers(0, 4), st.integers(0, 3), st.booleans(), st.integers(0, 500)
        ),
        max_size=40,
    ),
    pinned_first=st.booleans(),
)
def test_any_update_sequence_matches_brute_force(ops: list, pinned_first: bool) -> None:
    t = PageTable(SMALL, pinned_levels=1)
    own: dict[tuple[int, int, int], int] = {}
    if pinned_first:
        t.set_resident(3, 0, 0, 999)
        own[(3, 0, 0)] = 999
    for level, x, y, arrive, slot in ops:
        tx, ty = SMALL.tiles_in_level(level)
        tile = (level, x % tx, y % ty)
        if arrive:
            t.set_resident(*tile, slot=slot)
            own[tile] = slot
        else:
            assert t.set_absent(*tile) == (tile in own)
            own.pop(tile, None)
    assert_matches(t, own)


def test_atlas_layout_stacks_levels() -> None:
    t = PageTable(header(1000, 700), pinned_levels=1)  # rows 11, 6, 3, 2, 1
    assert t.atlas_size == (16, 23) and t.atlas_level_rows == [0, 11, 17, 20, 22]
    assert t.atlas_bytes == 16 * 23 * 8
