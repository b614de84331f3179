"""PageTables over the shared tile id space, against a brute-force reference: entries (header entries and
each tile's own slot), nearest-resident-ancestor lookups, batch updates and their errors, dirty ranges, slot
moves, the per-texture view, growth of the space and the GPU buffer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from texstream.config import BudgetConfig
from texstream.errors import BudgetError
from texstream.pack.format import PackHeader
from texstream.runtime.budget import BudgetManager
from texstream.runtime.page_buffer import PageTableBuffer
from texstream.runtime.page_table import (
    DIRTY_BLOCK,
    ENTRY_NONE,
    NO_LEVEL,
    NO_SLOT,
    PageTables,
    TexturePages,
)
from texstream.runtime.tiles import HEADER, TileSpace

NONE = int(ENTRY_NONE)
MAX_SLOT = (1 << 28) - 2  # the largest slot: level 15 with slot 2^28 - 1 would read as "nothing resident"
Tile = tuple[int, int, int, int]  # (texture, level, x, y)


def hdr(w: int, h: int, t: int = 64) -> PackHeader:
    return PackHeader(width=w, height=h, tile_size=t)


BIG = hdr(1000, 700)  # 16x11, 8x6, 4x3, 2x2, 1x1
MID = hdr(300, 200)  # 5x4, 3x2, 2x1, 1x1
TALL = hdr(200, 450)  # 4x8, 2x4, 1x2, 1x1
WIDE = hdr(700, 300, 128)  # 6x3, 3x2, 2x1, 1x1


def tiles_of(h: PackHeader) -> list[tuple[int, int, int]]:
    out = []
    for k in range(h.level_count):
        tx, ty = h.tiles_in_level(k)
        out += [(k, x, y) for y in range(ty) for x in range(tx)]
    return out


def encode(level: int, slot: int) -> int:
    return (level << 28) | slot


class Reference:
    """Brute force over one texture's whole id range (header entries included), from the pack's own
    geometry and the test's record of resident tiles.

    ``entry``: header entry k is level k's first tile id; a tile's entry encodes its own (level, slot)
    while resident, ENTRY_NONE otherwise. ``tile``, ``level``, ``slot`` (per tile, pack index order):
    what each page samples, its nearest resident tile (itself or an ancestor, found by walking up the
    levels), or -1 / NO_LEVEL / NO_SLOT when there is none.
    """

    def __init__(self, space: TileSpace, tex: int, header: PackHeader, own: dict[Tile, int]) -> None:
        rng = space.ranges[tex]
        first = rng.start + HEADER
        self.entry = np.full(rng.stop - rng.start, NONE, np.uint32)
        n = header.tile_count
        self.tile = np.full(n, -1, np.int64)
        self.level = np.full(n, NO_LEVEL, np.int64)
        self.slot = np.full(n, NO_SLOT, np.int64)
        top = header.level_count - 1
        for k in range(header.level_count):
            self.entry[k] = first + int(header.level_first[k])
            tx, ty = header.tiles_in_level(k)
            for y in range(ty):
                for x in range(tx):
                    i = header.tile_index(k, x, y)
                    if (tex, k, x, y) in own:
                        self.entry[HEADER + i] = encode(k, own[(tex, k, x, y)])
                    for up in range(k, top + 1):
                        ax, ay = x >> (up - k), y >> (up - k)
                        slot = own.get((tex, up, ax, ay))
                        if slot is not None:
                            self.tile[i] = first + header.tile_index(up, ax, ay)
                            self.level[i], self.slot[i] = up, slot
                            break


class World:
    """Textures in one space and page table, plus the test's own record of resident tiles."""

    def __init__(self, textures: dict[int, tuple[PackHeader, int]], capacity: int = 1 << 12) -> None:
        self.space = TileSpace(capacity)
        self.tables = PageTables(self.space)
        self.headers: dict[int, PackHeader] = {}
        self.pinned_from: dict[int, int] = {}
        self.own: dict[Tile, int] = {}
        for tex, (h, pinned) in textures.items():
            self.space.register(tex, h)
            self.open(tex, h, pinned)

    def open(self, tex: int, header: PackHeader, pinned: int) -> None:
        """Start the table of registered texture `tex`."""
        self.tables.add_texture(tex, pinned)
        self.headers[tex] = header
        self.pinned_from[tex] = max(0, header.level_count - pinned)

    def id(self, tile: Tile) -> int:
        return int(self.space.ids(*tile))

    def ids(self, tiles: list[Tile]) -> np.ndarray:
        return np.array([self.id(t) for t in tiles], np.int64)

    def arrive(self, tiles: list[Tile], slots: list[int]) -> None:
        self.tables.set_resident(self.ids(tiles), np.array(slots, np.int64))
        self.own.update(zip(tiles, slots, strict=True))

    def evict(self, tiles: list[Tile]) -> None:
        self.tables.set_absent(self.ids(tiles))
        for t in tiles:
            del self.own[t]

    def pinned_tiles(self, tex: int) -> list[Tile]:
        return [(tex, *t) for t in tiles_of(self.headers[tex]) if t[0] >= self.pinned_from[tex]]

    def check(self) -> None:
        """Every entry, lookup and count equals the brute-force reference."""
        e = self.tables.entry
        assert e.size == self.space.capacity
        for tex, h in self.headers.items():
            rng = self.space.ranges[tex]
            ref = Reference(self.space, tex, h, self.own)
            got = e[rng.start : rng.stop]
            bad = np.flatnonzero(got != ref.entry)
            if bad.size:
                i = rng.start + int(bad[0])
                raise AssertionError(
                    f"texture {tex}: {bad.size} entries differ; first id {i}: got {int(e[i]):#x}, "
                    f"expected {int(ref.entry[bad[0]]):#x}"
                )
            ids = np.arange(rng.first_tile, rng.stop)
            np.testing.assert_array_equal(self.tables.nearest_resident(ids), ref.tile)
            np.testing.assert_array_equal(self.tables.sample_slot(ids), ref.slot)
            # Pages with nothing resident: test_pages_with_nothing_resident_answer_none checks their level.
            some = ref.tile >= 0
            np.testing.assert_array_equal(self.tables.resident_level(ids)[some], ref.level[some])
            mine = {self.id(t) for t in self.own if t[0] == tex}
            np.testing.assert_array_equal(self.tables.is_resident(ids), np.isin(ids, list(mine)))
            assert self.tables.resident_count[tex] == len(mine)
            self.tables.validate(tex)
        np.testing.assert_array_equal(e[self.space.used :], NONE)  # ids of no texture are untouched


def check_ranges(ranges: list[tuple[int, int]], space: TileSpace) -> None:
    """Dirty ranges are sorted, non-empty, non-overlapping and inside the used ids."""
    for lo, hi in ranges:
        assert 0 <= lo < hi <= space.used, (lo, hi)
    for (_, hi0), (lo1, _) in zip(ranges, ranges[1:], strict=False):
        assert hi0 < lo1, ranges


def covered(ranges: list[tuple[int, int]], size: int) -> np.ndarray:
    mask = np.zeros(size, bool)
    for lo, hi in ranges:
        mask[lo:hi] = True
    return mask


def take_and_check(world: World, since: np.ndarray) -> list[tuple[int, int]]:
    """take_dirty covers every entry that differs from `since` (the entries at the last take)."""
    ranges = world.tables.take_dirty()
    check_ranges(ranges, world.space)
    used = world.space.used  # entries past the used ids never change
    changed = np.flatnonzero(world.tables.entry[:used] != since[:used])
    missed = changed[~covered(ranges, used)[changed]]
    assert missed.size == 0, f"changed ids {missed[:10].tolist()} are outside the dirty ranges {ranges}"
    return ranges


# ---- new tables --------------------------------------------------------------------------------------------------


def test_add_texture_writes_the_header_and_empties_the_pages() -> None:
    w = World({2: (BIG, 1), 0: (MID, 2)})
    for tex, h in w.headers.items():
        rng = w.space.ranges[tex]
        head = w.tables.entry[rng.start : rng.first_tile]
        np.testing.assert_array_equal(head[: h.level_count], w.space.level_first[tex, : h.level_count])
        np.testing.assert_array_equal(head[: h.level_count], rng.first_tile + h.level_first[:-1])
        np.testing.assert_array_equal(head[h.level_count :], NONE)
        assert head.dtype == np.uint32
        ids = w.space.tile_ids(tex)
        np.testing.assert_array_equal(w.tables.entry[ids], NONE)
        np.testing.assert_array_equal(w.tables.sample_slot(ids), NO_SLOT)
        np.testing.assert_array_equal(w.tables.nearest_resident(ids), -1)
        assert not w.tables.is_resident(ids).any()
    w.check()
    ranges = w.tables.take_dirty()
    assert ranges == [(0, w.space.used)]  # both new ranges, merged
    assert w.tables.take_dirty() == []


def test_add_texture_again_resets_the_texture() -> None:
    w = World({1: (MID, 1), 2: (TALL, 1)})
    w.arrive([(1, 3, 0, 0), (1, 0, 4, 3), (2, 3, 0, 0)], [5, 6, 7])
    w.tables.take_dirty()
    other = w.tables.entry[w.space.ranges[2].start : w.space.ranges[2].stop].copy()
    w.tables.add_texture(1, 1)
    w.own = {t: s for t, s in w.own.items() if t[0] != 1}
    w.check()
    np.testing.assert_array_equal(w.tables.entry[w.space.ranges[2].start : w.space.ranges[2].stop], other)
    rng = w.space.ranges[1]
    assert covered(w.tables.take_dirty(), w.space.used)[rng.start : rng.stop].all()


def test_pinned_levels_must_be_positive() -> None:
    space = TileSpace()
    space.register(0, MID)
    tables = PageTables(space)
    with pytest.raises(ValueError, match="got 0"):
        tables.add_texture(0, 0)


def test_coarsest_tile_makes_every_page_sample_it() -> None:
    w = World({7: (BIG, 1)})
    w.arrive([(7, 4, 0, 0)], [9])
    ids = w.space.tile_ids(7)
    top = w.id((7, 4, 0, 0))
    assert int(w.tables.entry[top]) == encode(4, 9)
    np.testing.assert_array_equal(w.tables.entry[ids[ids != top]], NONE)  # entries name only their own tile
    np.testing.assert_array_equal(w.tables.nearest_resident(ids), top)
    assert (w.tables.resident_level(ids) == 4).all() and (w.tables.sample_slot(ids) == 9).all()
    w.check()


def test_pages_with_nothing_resident_answer_none() -> None:
    """Before the pinned tiles arrive a page may have no resident tile: level NO_LEVEL (255), slot NO_SLOT."""
    w = World({0: (BIG, 1)})
    w.arrive([(0, 1, 2, 2)], [6])
    pages = w.ids([(0, 0, 0, 0), (0, 0, 4, 4), (0, 0, 5, 5), (0, 1, 2, 2), (0, 2, 1, 1), (0, 4, 0, 0)])
    assert w.tables.nearest_resident(pages).tolist() == [-1, pages[3], pages[3], pages[3], -1, -1]
    assert w.tables.sample_slot(pages).tolist() == [NO_SLOT, 6, 6, 6, NO_SLOT, NO_SLOT]
    assert w.tables.resident_level(pages).tolist() == [NO_LEVEL, 1, 1, 1, NO_LEVEL, NO_LEVEL]
    view = TexturePages(w.tables, 0)
    assert view.resident_levels(np.array([0, 0]), np.array([0, 4]), np.array([0, 4])).tolist() == [NO_LEVEL, 1]


def test_a_16_level_texture_walks_up_to_its_top() -> None:
    w = World({0: (hdr(1 << 21, 64), 1), 1: (MID, 1)})  # 32768 x 1 pages at level 0 ... 1 x 1 at level 15
    assert w.space.level_count[0] == 16
    w.arrive([(0, 15, 0, 0), (0, 14, 1, 0), (1, 3, 0, 0)], [1, 2, 3])
    lv = np.array([0, 0, 0, 7, 13, 14, 15])
    x = np.array([0, 16383, 16384, 127, 2, 1, 0])
    ids = w.space.ids(0, lv, x, 0)
    assert w.tables.resident_level(ids).tolist() == [15, 15, 14, 15, 14, 14, 15]
    assert w.tables.sample_slot(ids).tolist() == [1, 1, 2, 1, 2, 2, 1]
    all_ids = w.space.tile_ids(0)
    assert set(w.tables.resident_level(all_ids).tolist()) == {14, 15}


# ---- arrivals and evictions -------------------------------------------------------------------------------------


def test_arrival_overrides_coarser_pages_and_finer_tiles_win_in_a_batch() -> None:
    w = World({0: (BIG, 1)})
    w.arrive([(0, 4, 0, 0)], [1])
    # One batch, fine tiles listed first: the order within a batch does not matter.
    w.arrive([(0, 0, 5, 5), (0, 1, 2, 2), (0, 2, 1, 1)], [2, 3, 4])
    pages = w.ids([(0, 0, 5, 5), (0, 0, 4, 4), (0, 0, 6, 7), (0, 1, 2, 2), (0, 1, 3, 3), (0, 2, 1, 1), (0, 0, 0, 0)])
    assert w.tables.resident_level(pages).tolist() == [0, 1, 2, 1, 2, 2, 4]
    assert w.tables.sample_slot(pages).tolist() == [2, 3, 4, 3, 4, 4, 1]
    w.check()
    # A coarser arrival does not hide finer resident tiles; a resident tile may move to a new slot.
    w.arrive([(0, 3, 0, 0), (0, 1, 2, 2)], [5, 6])
    assert w.tables.resident_level(pages).tolist() == [0, 1, 2, 1, 2, 2, 3]
    assert w.tables.sample_slot(pages).tolist() == [2, 6, 4, 6, 4, 4, 5]
    assert w.tables.resident_count[0] == 5
    w.check()


def test_evictions_fall_back_to_the_nearest_resident_ancestor() -> None:
    w = World({0: (BIG, 1)})
    w.arrive([(0, 4, 0, 0), (0, 2, 1, 1), (0, 1, 2, 2), (0, 0, 4, 4)], [9, 3, 4, 5])
    pages = w.ids([(0, 0, 4, 4), (0, 0, 4, 5), (0, 0, 6, 6), (0, 1, 2, 2), (0, 1, 3, 2), (0, 2, 1, 1), (0, 0, 9, 9)])
    assert w.tables.resident_level(pages).tolist() == [0, 1, 2, 1, 2, 2, 4]
    w.evict([(0, 1, 2, 2)])
    assert w.tables.resident_level(pages).tolist() == [0, 2, 2, 2, 2, 2, 4]
    assert w.tables.sample_slot(pages).tolist() == [5, 3, 3, 3, 3, 3, 9]
    w.check()
    # A tile and its resident ancestor together, fine one listed first: both fall to the top.
    w.arrive([(0, 1, 2, 2)], [4])
    w.evict([(0, 0, 4, 4), (0, 1, 2, 2), (0, 2, 1, 1)])
    assert w.tables.resident_level(pages).tolist() == [4] * 7
    assert w.tables.sample_slot(pages).tolist() == [9] * 7
    assert w.tables.resident_count[0] == 1
    w.check()


def test_eviction_before_the_pinned_tile_arrives_leaves_pages_empty() -> None:
    w = World({0: (MID, 1)})
    w.arrive([(0, 1, 1, 1)], [3])
    w.evict([(0, 1, 1, 1)])
    np.testing.assert_array_equal(w.tables.entry[w.space.tile_ids(0)], NONE)
    w.check()


def test_remove_texture_empties_only_its_tiles() -> None:
    w = World({0: (MID, 1), 1: (TALL, 1)})
    w.arrive([(0, 3, 0, 0), (0, 0, 1, 1), (1, 3, 0, 0)], [1, 2, 3])
    r0, r1 = w.space.ranges[0], w.space.ranges[1]
    other = w.tables.entry[r1.start : r1.stop].copy()
    w.tables.remove_texture(0)
    np.testing.assert_array_equal(w.tables.entry[r0.first_tile : r0.stop], NONE)
    assert not w.tables.is_resident(np.arange(r0.first_tile, r0.stop)).any()
    assert w.tables.resident_count[0] == 0 and w.tables.resident_count[1] == 1
    np.testing.assert_array_equal(w.tables.entry[r1.start : r1.stop], other)


def test_empty_batches_do_nothing() -> None:
    w = World({0: (MID, 1)})
    w.tables.take_dirty()
    before = w.tables.entry.copy()
    w.tables.set_resident(np.zeros(0, np.int64), np.zeros(0, np.int64))
    w.tables.set_absent(np.zeros(0, np.int64))
    np.testing.assert_array_equal(w.tables.entry, before)
    assert w.tables.take_dirty() == []


def test_largest_slot() -> None:
    w = World({0: (MID, 1)})
    w.arrive([(0, 3, 0, 0), (0, 0, 4, 3)], [MAX_SLOT, 0])
    assert w.tables.sample_slot(w.ids([(0, 0, 0, 0), (0, 0, 4, 3)])).tolist() == [MAX_SLOT, 0]
    w.check()


# ---- bad updates ------------------------------------------------------------------------------------------------


def assert_unchanged(w: World, before: np.ndarray, count: int) -> None:
    np.testing.assert_array_equal(w.tables.entry, before)
    assert int(w.tables.resident_count[0]) == count


def test_pinned_levels_cannot_be_set_absent() -> None:
    w = World({0: (BIG, 2), 1: (MID, 1)})  # texture 0: levels 3 and 4 pinned
    w.arrive(w.pinned_tiles(0) + [(0, 2, 0, 0), (1, 3, 0, 0), (1, 2, 0, 0)], [1, 2, 3, 4, 5, 6, 7, 8])
    before = w.tables.entry.copy()
    for tile in w.pinned_tiles(0):
        with pytest.raises(ValueError, match=rf"texture 0, level {tile[1]}, {tile[2]}, {tile[3]}\).*pinned"):
            w.tables.set_absent(w.ids([tile]))
    with pytest.raises(ValueError, match="pinned"):  # one pinned tile spoils the batch; nothing changes
        w.tables.set_absent(w.ids([(0, 2, 0, 0), (0, 3, 1, 1)]))
    assert_unchanged(w, before, 6)
    assert w.tables.is_resident(w.ids([(0, 2, 0, 0)])).all()
    with pytest.raises(ValueError, match="pinned"):  # texture 1 pins only its top level
        w.tables.set_absent(w.ids([(1, 3, 0, 0)]))
    w.evict([(0, 2, 0, 0), (1, 2, 0, 0)])  # the levels below are not pinned
    w.check()


def test_set_resident_rejects_bad_batches() -> None:
    w = World({0: (MID, 1), 1: (TALL, 1), 2: (TALL, 1)})
    w.arrive([(0, 3, 0, 0)], [4])
    rng0, rng2 = w.space.ranges[0], w.space.ranges[2]
    w.space.unregister(2)  # its ids name no tile any more
    good = w.id((0, 0, 1, 1))
    before = w.tables.entry.copy()
    for bad in (rng0.start, rng0.start + 3, rng2.first_tile, rng2.stop - 1, -1, w.space.capacity, w.space.capacity + 5):
        with pytest.raises(ValueError, match=rf"id {bad} names no tile"):
            w.tables.set_resident(np.array([good, bad]), np.array([1, 2]))
    with pytest.raises(ValueError, match="twice"):
        w.tables.set_resident(np.array([good, good]), np.array([1, 2]))
    with pytest.raises(ValueError, match="-1"):
        w.tables.set_resident(np.array([good]), np.array([-1]))
    with pytest.raises(ValueError, match=str(MAX_SLOT + 1)):
        w.tables.set_resident(np.array([good]), np.array([MAX_SLOT + 1]))
    with pytest.raises(ValueError, match="2 tiles but 1 slots"):
        w.tables.set_resident(np.array([good, good + 1]), np.array([1]))
    assert_unchanged(w, before, 1)


def test_set_absent_rejects_bad_batches() -> None:
    w = World({0: (MID, 1)})
    w.arrive([(0, 3, 0, 0), (0, 0, 1, 1), (0, 1, 1, 0)], [4, 5, 6])
    before = w.tables.entry.copy()
    with pytest.raises(ValueError, match="twice"):
        w.tables.set_absent(w.ids([(0, 0, 1, 1), (0, 0, 1, 1)]))
    with pytest.raises(ValueError, match=r"texture 0, level 0, 2, 1\) is not resident"):
        w.tables.set_absent(w.ids([(0, 0, 1, 1), (0, 0, 2, 1)]))
    rng = w.space.ranges[0]
    for bad in (rng.start, rng.stop, -3):
        with pytest.raises(ValueError, match=rf"id {bad} names no tile"):
            w.tables.set_absent(np.array([w.id((0, 1, 1, 0)), bad]))
    assert_unchanged(w, before, 3)
    assert w.tables.is_resident(w.ids([(0, 0, 1, 1), (0, 1, 1, 0)])).all()
    w.check()


# ---- random batches against the reference ------------------------------------------------------------------------

BATCH = st.tuples(
    st.booleans(),  # arrivals (True) or evictions
    st.lists(  # (texture pick, tile pick, slot)
        st.tuples(st.integers(0, 2), st.integers(0, 1 << 16), st.one_of(st.integers(0, 60), st.just(MAX_SLOT))),
        min_size=1,
        max_size=10,
    ),
    st.booleans(),  # take the dirty ranges afterwards
)


@settings(max_examples=40, deadline=None)
@given(
    pinned=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
    pin_first=st.booleans(),
    batches=st.lists(BATCH, max_size=10),
)
def test_random_batches_match_the_reference(
    pinned: tuple[int, int, int], pin_first: bool, batches: list[tuple[bool, list, bool]]
) -> None:
    texs = (3, 0, 200)  # not in id order, not 0..n-1
    w = World({t: (h, p) for t, h, p in zip(texs, (MID, TALL, WIDE), pinned, strict=True)}, capacity=50)
    tiles = {t: [(t, *c) for c in tiles_of(w.headers[t])] for t in texs}
    since = np.full(w.space.capacity, 0xDEADBEEF, np.uint32)  # what the GPU copy held at the last take
    gpu = since.copy()

    def take() -> None:
        nonlocal since
        for lo, hi in take_and_check(w, since):
            gpu[lo:hi] = w.tables.entry[lo:hi]
        np.testing.assert_array_equal(gpu[: w.space.used], w.tables.entry[: w.space.used])
        since = w.tables.entry.copy()

    take()
    if pin_first:
        pins = [p for t in texs for p in w.pinned_tiles(t)]
        w.arrive(pins, list(range(100, 100 + len(pins))))
        w.check()
    for arrive, picks, do_take in batches:
        if arrive:
            chosen: dict[Tile, int] = {}
            for ti, pick, slot in picks:
                chosen.setdefault(tiles[texs[ti]][pick % len(tiles[texs[ti]])], slot)
            w.arrive(list(chosen), list(chosen.values()))
        else:
            evictable = sorted(t for t in w.own if t[1] < w.pinned_from[t[0]])
            if not evictable:
                continue
            chosen_tiles = {evictable[pick % len(evictable)] for _, pick, _ in picks}
            w.evict(sorted(chosen_tiles, key=lambda t: t[1]))  # finest first
        w.check()
        if do_take:
            take()
    take()
    # Once every pinned tile is resident, every page maps to something.
    pins = [p for t in texs for p in w.pinned_tiles(t) if p not in w.own]
    w.arrive(pins, [7] * len(pins))
    for t in texs:
        assert (w.tables.nearest_resident(w.space.tile_ids(t)) >= 0).all()
        assert (w.tables.sample_slot(w.space.tile_ids(t)) >= 0).all()
    w.check()
    take()


@pytest.mark.parametrize("seed", [0, 1])
def test_large_random_batches_match_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    textures = {
        10: (BIG, 1),
        11: (hdr(64 * 13 + 5, 64 * 7 - 3), 2),
        12: (hdr(2000, 130), 1),
        13: (hdr(3000, 17, 128), 1),
        14: (hdr(70, 3000), 3),
    }
    w = World(textures, capacity=64)
    tiles = [(t, *c) for t in textures for c in tiles_of(w.headers[t])]
    since = w.tables.entry.copy()
    since[:] = 0xDEADBEEF
    for step in range(14):
        evictable = [t for t in w.own if t[1] < w.pinned_from[t[0]]]
        if evictable and rng.random() < 0.45:
            pick = rng.choice(len(evictable), size=min(len(evictable), int(rng.integers(1, 60))), replace=False)
            w.evict([evictable[i] for i in pick])
        else:
            pick = rng.choice(len(tiles), size=int(rng.integers(1, 80)), replace=False)
            w.arrive([tiles[i] for i in pick], rng.integers(0, 5000, pick.size).tolist())
        if step % 3 == 0:
            w.check()
        if rng.random() < 0.5:
            take_and_check(w, since)
            since = w.tables.entry.copy()
    w.check()
    take_and_check(w, since)


def test_a_large_texture_matches_the_reference() -> None:
    w = World({0: (hdr(4096, 4096), 1), 1: (MID, 1)})  # 64x64 pages at level 0, 7 levels
    rng = np.random.default_rng(3)
    tiles = [(0, *c) for c in tiles_of(w.headers[0])]
    pick = rng.choice(len(tiles), size=600, replace=False)
    w.arrive([tiles[i] for i in pick], list(range(600)))
    w.check()
    w.evict([t for t in list(w.own)[::2] if t[1] < 6])
    w.check()


# ---- dirty ranges -----------------------------------------------------------------------------------------------


def block_of(i: int, used: int) -> tuple[int, int]:
    """The dirty range one changed entry `i` goes out in: its whole block, clipped to the ids in use."""
    lo = i // DIRTY_BLOCK * DIRTY_BLOCK
    return lo, min(lo + DIRTY_BLOCK, used)


def test_dirty_ranges_after_single_changes() -> None:
    w = World({0: (hdr(8192, 8192), 1), 1: (MID, 1)})  # 128x128 tiles at level 0: several blocks
    used = w.space.used
    assert w.tables.take_dirty() == [(0, used)]
    w.arrive([(0, 0, 5, 5)], [3])  # one page
    i = w.id((0, 0, 5, 5))
    assert w.tables.take_dirty() == [block_of(i, used)]
    assert w.tables.take_dirty() == []
    j = w.id((0, 2, 3, 2))
    w.arrive([(0, 2, 3, 2)], [4])  # entries name only their own tile: one entry changes
    assert w.tables.take_dirty() == [block_of(j, used)]
    w.evict([(0, 2, 3, 2)])
    assert w.tables.take_dirty() == [block_of(j, used)]
    since = w.tables.entry.copy()
    w.arrive([(0, 4, 0, 0), (0, 0, 6, 6), (1, 0, 0, 0)], [1, 2, 3])
    w.evict([(0, 0, 5, 5)])
    take_and_check(w, since)
    w.tables.mark_all_dirty()
    assert w.tables.take_dirty() == [(0, used)]


def test_far_apart_changes_are_separate_ranges_and_neighbouring_blocks_one() -> None:
    w = World({0: (hdr(8192, 8192), 1), 1: (MID, 1)})
    used = w.space.used
    w.tables.take_dirty()
    a, b, c = (0, 0, 0, 0), (0, 0, 127, 127), (1, 0, 0, 0)
    w.arrive([a, b, c], [1, 2, 3])
    blocks = [block_of(w.id(t), used) for t in (a, b, c)]
    assert blocks[0][1] < blocks[1][0] and blocks[1][1] < blocks[2][0]  # far apart: blocks between
    assert w.tables.take_dirty() == blocks
    first, second = w.id((0, 0, 0, 0)), w.id((0, 0, 0, 0)) + DIRTY_BLOCK  # in two neighbouring blocks
    tiles = [w.space.coords(np.array([k])) for k in (first, second)]
    w.arrive([tuple(int(v[0]) for v in t) for t in tiles[1:]], [4])
    w.evict([a])
    lo = first // DIRTY_BLOCK * DIRTY_BLOCK
    assert w.tables.take_dirty() == [(lo, lo + 2 * DIRTY_BLOCK)]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1 << 16), st.integers(0, 3)), min_size=1, max_size=30))
def test_dirty_ranges_cover_every_change(ops: list[tuple[bool, int, int]]) -> None:
    w = World({0: (BIG, 1), 1: (TALL, 1)})
    w.arrive(w.pinned_tiles(0) + w.pinned_tiles(1), [0, 1])
    tiles = [(t, *c) for t in (0, 1) for c in tiles_of(w.headers[t])]
    since = w.tables.entry.copy()
    since[:] = 0xDEADBEEF
    for i, (arrive, pick, take_every) in enumerate(ops):
        tile = tiles[pick % len(tiles)]
        if arrive or tile not in w.own or tile[1] >= w.pinned_from[tile[0]]:
            w.arrive([tile], [i + 2])
        else:
            w.evict([tile])
        if take_every == 0 or i == len(ops) - 1:
            take_and_check(w, since)
            since = w.tables.entry.copy()
    w.check()


# ---- slot moves ---------------------------------------------------------------------------------------------------


def test_move_slots_renames_only_in_the_listed_textures() -> None:
    w = World({0: (BIG, 1), 1: (MID, 1), 2: (TALL, 1)})
    # The same slot numbers in every texture; 16 is also the value of texture 0's first header entry.
    w.arrive([(0, 4, 0, 0), (0, 1, 0, 0), (0, 0, 3, 3), (0, 0, 9, 9)], [10, 11, 12, 16])
    w.arrive([(1, 3, 0, 0), (1, 0, 1, 1)], [10, 11])
    w.arrive([(2, 3, 0, 0), (2, 1, 1, 1)], [11, 10])
    w.tables.take_dirty()
    before = w.tables.entry.copy()
    rng1 = w.space.ranges[1]
    old, new = np.array([11, 10, 16, 17]), np.array([10, 11, 2, 3])  # a swap and a move
    w.tables.move_slots([0, 2], old, new)
    rename = dict(zip(old.tolist(), new.tolist(), strict=True))
    w.own = {t: (rename.get(s, s) if t[0] != 1 else s) for t, s in w.own.items()}
    w.check()
    np.testing.assert_array_equal(w.tables.entry[rng1.start : rng1.stop], before[rng1.start : rng1.stop])
    for t in (0, 2):
        r = w.space.ranges[t]
        np.testing.assert_array_equal(w.tables.entry[r.start : r.first_tile], before[r.start : r.first_tile])
    pages = w.ids([(0, 0, 3, 3), (0, 0, 9, 9), (0, 0, 0, 0), (0, 0, 15, 10)])
    assert w.tables.sample_slot(pages).tolist() == [12, 2, 10, 11]  # own, own, (1, 0, 0)'s, the top's
    changed = np.flatnonzero(w.tables.entry != before)
    assert covered(w.tables.take_dirty(), before.size)[changed].all()


def test_move_slots_arguments() -> None:
    w = World({0: (MID, 1)})
    w.arrive([(0, 3, 0, 0)], [5])
    w.tables.take_dirty()
    with pytest.raises(ValueError, match="2 vs 1"):
        w.tables.move_slots([0], np.array([5, 6]), np.array([1]))
    w.tables.move_slots([0], np.array([], np.int64), np.array([], np.int64))
    assert w.tables.take_dirty() == []
    w.tables.move_slots([0], np.array([5]), np.array([5]))  # a slot onto itself
    w.check()


# ---- the per-texture view --------------------------------------------------------------------------------------


def test_texture_pages_agree_with_the_tables() -> None:
    w = World({4: (MID, 1), 9: (BIG, 2)})
    w.arrive(w.pinned_tiles(9) + [(9, 0, 3, 4), (9, 1, 7, 5), (4, 0, 4, 3), (4, 3, 0, 0)], list(range(9)))
    view = TexturePages(w.tables, 9)
    assert (view.level_count, view.top_level, view.first_pinned_level) == (5, 4, 3)
    assert view.tiles_x.tolist() == [16, 8, 4, 2, 1] and view.tiles_y.tolist() == [11, 6, 3, 2, 1]
    assert view.resident_count == 7
    rng = w.space.ranges[9]
    assert view.bytes_on_gpu == (rng.stop - rng.start) * 4
    lv, x, y = (np.array(c) for c in zip(*tiles_of(BIG), strict=True))
    ids = w.space.ids(9, lv, x, y)
    np.testing.assert_array_equal(view.ids(lv, x, y), ids)
    np.testing.assert_array_equal(view.flat_index(lv, x, y), [BIG.tile_index(*c) for c in tiles_of(BIG)])
    np.testing.assert_array_equal(view.is_resident(lv, x, y), w.tables.is_resident(ids))
    np.testing.assert_array_equal(view.resident_levels(lv, x, y), w.tables.resident_level(ids))
    np.testing.assert_array_equal(view.slots_at(lv, x, y), w.tables.sample_slot(ids))
    assert view.slots_at(np.array([0]), np.array([3]), np.array([4])).tolist() == [5]
    assert view.resident_levels(np.array([0]), np.array([2]), np.array([4])).tolist() == [3]
    got = sorted(zip(*(a.tolist() for a in view.resident_tiles()), strict=True))
    assert got == sorted((t[1], t[2], t[3], s) for t, s in w.own.items() if t[0] == 9)
    view.validate()
    small = TexturePages(w.tables, 4)
    assert small.resident_count == 2 and small.first_pinned_level == 3 and small.top_level == 3
    with pytest.raises(ValueError, match=r"\(9, 0, 16, 0\)"):
        view.slots_at(np.array([0]), np.array([16]), np.array([0]))


# ---- growth of the id space --------------------------------------------------------------------------------------


def test_growth_of_the_space_keeps_the_entries() -> None:
    w = World({}, capacity=32)
    space, tables = w.space, w.tables
    space.register(0, MID)  # 45 ids: grows to 64
    assert tables.entry.size == tables.own.size == space.capacity == 64
    w.open(0, MID, 1)
    w.arrive([(0, 3, 0, 0), (0, 0, 2, 2), (0, 1, 2, 1)], [1, 2, 3])
    before = tables.entry.copy()
    space.register(1, BIG)  # 257 more ids: grows to 302
    assert tables.entry.size == tables.own.size == space.capacity == 302
    np.testing.assert_array_equal(tables.entry[:64], before)
    np.testing.assert_array_equal(tables.entry[64:], NONE)
    assert tables.is_resident(w.ids([(0, 3, 0, 0), (0, 0, 2, 2), (0, 0, 2, 3)])).tolist() == [True, True, False]
    w.open(1, BIG, 1)
    w.arrive([(1, 4, 0, 0), (1, 0, 15, 10)], [4, 5])
    w.evict([(0, 0, 2, 2)])
    w.check()
    assert tables.take_dirty()[-1][1] == space.used


def test_tables_made_after_growth_span_the_space() -> None:
    space = TileSpace(capacity=8)
    space.register(0, BIG)
    tables = PageTables(space)
    assert tables.entry.size == tables.own.size == space.capacity


# ---- the GPU buffer ---------------------------------------------------------------------------------------------

SENTINEL = 0xDEADBEEF


def read_back(buf: PageTableBuffer, n: int | None = None) -> np.ndarray:
    assert buf.buffer is not None
    return np.frombuffer(buf.buffer.read(), np.uint32)[:n]


def fill(buf: PageTableBuffer) -> None:
    assert buf.buffer is not None
    buf.buffer.write(np.full(buf.entries, SENTINEL, np.uint32))


def runs(mask: np.ndarray) -> int:
    m = np.concatenate([[False], mask, [False]]).astype(np.int8)
    return int(np.count_nonzero(np.diff(m) == 1))


@pytest.mark.gl
def test_buffer_holds_the_dirty_entries_after_upload(gl_context) -> None:  # noqa: ANN001
    w = World({0: (hdr(4096, 4096), 1), 5: (BIG, 2), 1: (MID, 1)})
    budget = BudgetManager(BudgetConfig(budget_mb=1))
    buf = PageTableBuffer(gl_context, budget, w.space.used)
    used = w.space.used
    try:
        assert buf.entries == PageTableBuffer.entries_for(used) >= used and buf.entries % PageTableBuffer.STEP == 0
        assert buf.buffer is not None and buf.buffer.size == buf.nbytes == budget.reserved("page-tables")
        fill(buf)
        assert buf.upload(w.tables) == 1  # every new range, merged
        np.testing.assert_array_equal(read_back(buf, used), w.tables.entry[:used])
        assert buf.upload(w.tables) == 0
        w.arrive(w.pinned_tiles(0) + w.pinned_tiles(5) + w.pinned_tiles(1), list(range(7)))
        buf.upload(w.tables)
        np.testing.assert_array_equal(read_back(buf, used), w.tables.entry[:used])
        rng = np.random.default_rng(1)
        tiles = [(t, *c) for t in w.headers for c in tiles_of(w.headers[t])]
        for _ in range(6):
            fill(buf)  # what the upload does not write keeps the sentinel
            since = w.tables.entry[: w.space.used].copy()
            pick = rng.choice(len(tiles), size=5, replace=False)
            w.arrive([tiles[i] for i in pick], rng.integers(10, 99, 5).tolist())
            evictable = [t for t in w.own if t[1] < w.pinned_from[t[0]]]
            w.evict(evictable[1:3])
            n = buf.upload(w.tables)
            got = read_back(buf, used)
            entry = w.tables.entry[:used]
            written = got != SENTINEL
            assert n == runs(written) >= 1  # each range is one written run (merged ranges never touch)
            np.testing.assert_array_equal(got[written], entry[written])
            changed = np.flatnonzero(entry != since)
            np.testing.assert_array_equal(got[changed], entry[changed])
        w.check()
        buf.bind(3)
    finally:
        buf.release()
    assert buf.buffer is None and budget.reserved("page-tables") == 0
    buf.bind(3)  # released: nothing to bind, no error
    buf.release()


@pytest.mark.gl
def test_nearby_dirty_ranges_go_out_in_one_write_and_far_ones_apart(gl_context) -> None:  # noqa: ANN001
    w = World({0: (hdr(8192, 8192), 1)})  # 128x128 tiles at level 0: ids far enough apart
    budget = BudgetManager(BudgetConfig(budget_mb=1))
    buf = PageTableBuffer(gl_context, budget, w.space.used)
    used, gap = w.space.used, PageTableBuffer.WRITE_GAP
    try:
        buf.upload(w.tables)
        near = [(0, 0, 0, 0), (0, 0, 2, 0), (0, 0, 0, (gap - 1) // 128)]  # all within one gap of the first
        far = [(0, 0, 5, 127)]  # id 127 * 128 + 5: more than a gap past the others
        assert w.id(far[0]) - w.id(near[-1]) > gap
        fill(buf)
        w.arrive(near, [1, 2, 3])
        assert buf.upload(w.tables) == 1
        got, entry = read_back(buf, used), w.tables.entry[:used]
        lo, hi = w.id(near[0]), w.id(near[-1]) + 1
        lo, hi = lo // DIRTY_BLOCK * DIRTY_BLOCK, -(-hi // DIRTY_BLOCK) * DIRTY_BLOCK  # whole dirty blocks
        np.testing.assert_array_equal(got[lo:hi], entry[lo:hi])  # the entries between are written too
        assert (got[:lo] == SENTINEL).all() and (got[hi:] == SENTINEL).all()
        fill(buf)
        w.arrive(far, [4])
        w.evict(near[1:2])
        assert buf.upload(w.tables) == 2
        got = read_back(buf, used)
        written = got != SENTINEL
        assert runs(written) == 2
        np.testing.assert_array_equal(got[written], entry[written])
    finally:
        buf.release()


@pytest.mark.gl
def test_fit_grows_the_buffer_and_uploads_everything_again(gl_context) -> None:  # noqa: ANN001
    w = World({0: (BIG, 1), 1: (MID, 1)})
    budget = BudgetManager(BudgetConfig(budget_mb=1))
    buf = PageTableBuffer(gl_context, budget)
    try:
        assert buf.entries == PageTableBuffer.STEP and buf.growth_bytes(100) == 0
        big = PageTableBuffer.STEP * 3 + 5
        assert buf.growth_bytes(big) == 3 * PageTableBuffer.STEP * 4
        buf.upload(w.tables)
        buf.fit(big, w.tables)
        assert buf.entries == 4 * PageTableBuffer.STEP and budget.reserved("page-tables") == buf.nbytes
        fill(buf)
        buf.upload(w.tables)  # everything is dirty again after a grow
        np.testing.assert_array_equal(read_back(buf, w.space.used), w.tables.entry[: w.space.used])
        with pytest.raises(BudgetError):
            buf.fit(1 << 20, w.tables)  # 4 MiB of entries in a 1 MiB budget
        assert buf.entries == 4 * PageTableBuffer.STEP and budget.reserved("page-tables") == buf.nbytes
    finally:
        buf.release()
