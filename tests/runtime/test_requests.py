"""RequestScheduler: dedup, missing chains parents first, priority, caps, cancel, prefetch, retry back-off."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.config import StreamerConfig
from texstream.pack.format import PackHeader
from texstream.runtime.feedback_reduce import Wanted
from texstream.runtime.page_table import PageTables
from texstream.runtime.requests import Requests, RequestScheduler
from texstream.runtime.tiles import TileSpace

HEADER = PackHeader(width=1000, height=700, tile_size=64)  # levels 0..4: tiles 16x11, 8x6, 4x3, 2x2, 1x1
TILE = HEADER.tile_raw_size
BIG = PackHeader(width=4096, height=4096, tile_size=128)  # levels 0..5: 32x32 .. 1x1 tiles
BIG_TILE = BIG.tile_raw_size

Tile = tuple[int, int, int, int]  # (texture, level, x, y)
Page = tuple[int, int, int, int, int]  # (texture, level, x, y, coverage)


class World:
    """Tile space, page tables and scheduler without GL. Tiles a call to `update` issues count as in
    flight (the uploader's answer to `loading`) until `arrive` makes them resident or `drop` ends them."""

    def __init__(
        self,
        headers: dict[int, PackHeader] | None = None,
        space: TileSpace | None = None,
        max_tiles: int = 256,
        max_bytes: int = 16 << 20,
        **config: object,
    ) -> None:
        self.headers: dict[int, PackHeader] = {}
        self.space = space or TileSpace()
        self.tables = PageTables(self.space)
        for tex, header in (headers or {0: HEADER}).items():
            self.add(tex, header)
        self.in_flight: set[int] = set()
        cfg = StreamerConfig(
            **({"prefetch": False, "upload_tiles_per_frame": max_tiles, "upload_bytes_per_frame": max_bytes} | config)
        )
        self.sched = RequestScheduler(cfg, self.space, self.tables, self.loading)
        self.slot = 0

    def add(self, tex: int, header: PackHeader) -> None:
        self.space.register(tex, header)
        self.tables.add_texture(tex, pinned_levels=1)
        self.headers[tex] = header

    def loading(self, ids: np.ndarray) -> np.ndarray:
        return np.isin(np.asarray(ids, np.int64), np.fromiter(self.in_flight, np.int64, len(self.in_flight)))

    # ---- naming ---------------------------------------------------------------------------------
    def id(self, tex: int, level: int, x: int, y: int) -> int:
        """The documented layout: the texture's first tile id plus the tile's position in its pack index."""
        return self.space.ranges[tex].first_tile + self.headers[tex].tile_index(level, x, y)

    def ids(self, *tiles: Tile) -> np.ndarray:
        return np.array([self.id(*t) for t in tiles], np.int64)

    def names(self, ids: np.ndarray) -> list[Tile]:
        t, lv, x, y = self.space.coords(np.asarray(ids, np.int64))
        return list(zip(t.tolist(), lv.tolist(), x.tolist(), y.tolist(), strict=True))

    # ---- residency ------------------------------------------------------------------------------
    def resident(self, *tiles: Tile) -> None:
        self.make_resident(self.ids(*tiles))

    def resident_levels(self, tex: int, *levels: int) -> None:
        self.make_resident(self.space.tile_ids(tex, range(min(levels), max(levels) + 1)))

    def make_resident(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, np.int64)
        self.tables.set_resident(ids, np.arange(self.slot, self.slot + ids.size))
        self.slot += int(ids.size)
        self.sched.mark_resident(ids)

    def arrive(self, ids: np.ndarray) -> None:
        self.in_flight.difference_update(np.asarray(ids).tolist())
        self.make_resident(ids)

    def drop(self, ids: np.ndarray) -> None:
        self.in_flight.difference_update(np.asarray(ids).tolist())

    # ---- one frame ------------------------------------------------------------------------------
    def want(self, *pages: Page) -> Wanted:
        cover: dict[int, int] = {}
        for tex, level, x, y, count in pages:
            i = self.id(tex, level, x, y)
            cover[i] = cover.get(i, 0) + count
        ids = sorted(cover)
        return Wanted(np.array(ids, np.int64), np.array([cover[i] for i in ids], np.int64))

    def update(self, frame: int, *pages: Page, max_issue: int = 1 << 20) -> Requests:
        r = self.sched.update(frame, self.want(*pages), max_issue)
        self.in_flight.update(r.ids.tolist())
        return r

    def issue(self, frame: int, *pages: Page, max_issue: int = 1 << 20) -> list[Tile]:
        return self.names(self.update(frame, *pages, max_issue=max_issue).ids)

    def assert_parents_first(self, ids: np.ndarray, in_flight_before: set[int]) -> None:
        """Every issued tile's parent is resident, was in flight, or comes earlier in the same cut."""
        ids = np.asarray(ids, np.int64)
        for i, tile in enumerate(ids.tolist()):
            parent = int(self.space.parent[tile])
            if parent < 0 or bool(self.tables.is_resident(np.array([parent]))[0]):
                continue
            assert parent in in_flight_before or parent in ids[:i].tolist(), (
                f"{self.names([tile])[0]} issued at position {i} of {self.names(ids)} "
                f"before its missing parent {self.names([parent])[0]}"
            )


def bytes_of(w: World, ids: np.ndarray) -> int:
    return int(w.space.tile_bytes[w.space.tex[np.asarray(ids, np.int64)].astype(np.int64)].sum())


# ---- dedup ----------------------------------------------------------------------------------------
def test_resident_pages_are_not_requested_and_a_page_is_queued_once() -> None:
    w = World()
    w.resident_levels(0, 4)
    w.resident((0, 3, 0, 0), (0, 2, 1, 1), (0, 1, 2, 2), (0, 0, 5, 4))
    r = w.update(0, (0, 0, 5, 4, 9), (0, 3, 0, 0, 2), (0, 4, 0, 0, 1))
    assert len(r) == 0 and r.capped == 0 and w.sched.queued_count == 0
    # Wanted in two frames while it waits: one queue entry.
    for f in (1, 2):
        r = w.update(f, (0, 0, 4, 4, 3), max_issue=0)
        assert len(r) == 0 and r.capped == 1 and w.sched.queued_count == 1
    assert w.names(w.sched.queue) == [(0, 0, 4, 4)]
    r = w.update(3, (0, 0, 4, 4, 3))
    assert w.names(r.ids) == [(0, 0, 4, 4)] and r.prefetch.tolist() == [False] and r.capped == 0


def test_tiles_in_flight_are_not_requested_again() -> None:
    w = World()
    w.resident_levels(0, 4)
    w.resident((0, 3, 0, 0), (0, 2, 1, 1), (0, 1, 2, 2))
    k = w.ids((0, 0, 5, 4))
    assert w.issue(0, (0, 0, 5, 4, 1)) == [(0, 0, 5, 4)]
    for f in (1, 2):  # its load is in flight
        r = w.update(f, (0, 0, 5, 4, 1))
        assert len(r) == 0 and w.sched.queued_count == 0
    # It arrives; the scheduler sees it in the page tables even before mark_resident.
    w.in_flight.clear()
    w.tables.set_resident(k, np.array([99]))
    assert len(w.update(3, (0, 0, 5, 4, 1))) == 0 and w.sched.queued_count == 0


def test_queued_tiles_that_start_loading_or_arrive_elsewhere_leave_the_queue() -> None:
    w = World()
    w.resident_levels(0, 4, 3, 2, 1)
    w.update(0, (0, 0, 0, 0, 1), (0, 0, 2, 2, 1), (0, 0, 4, 4, 1), max_issue=0)
    assert w.sched.queued_count == 3
    w.in_flight.add(w.id(0, 0, 0, 0))  # e.g. the streamer loads it itself
    w.tables.set_resident(w.ids((0, 0, 2, 2)), np.array([50]))  # arrived without the scheduler
    r = w.update(1, max_issue=0)
    assert (len(r), r.capped, r.cancelled) == (0, 1, 0)
    assert w.names(w.sched.queue) == [(0, 0, 4, 4)]
    assert w.issue(2) == [(0, 0, 4, 4)]


# ---- missing chains -------------------------------------------------------------------------------
def test_a_whole_missing_chain_is_issued_in_one_frame_parents_first() -> None:
    w = World()
    w.resident_levels(0, 4)
    r = w.update(0, (0, 0, 5, 4, 1))
    assert w.names(r.ids) == [(0, 3, 0, 0), (0, 2, 1, 1), (0, 1, 2, 2), (0, 0, 5, 4)]
    assert not r.prefetch.any() and r.capped == 0 and w.sched.queued_count == 0
    assert w.sched.stats.issued == 4 and w.sched.stats.issued_prefetch == 0


def test_nothing_resident_requests_from_the_coarsest_level() -> None:
    w = World()
    assert w.issue(0, (0, 1, 3, 3, 1)) == [(0, 4, 0, 0), (0, 3, 0, 0), (0, 2, 1, 1), (0, 1, 3, 3)]


def test_chains_sharing_ancestors_issue_each_tile_once() -> None:
    w = World()
    w.resident_levels(0, 4)
    # (0, 4, 4) and (0, 5, 4) share every ancestor: those weigh 4 + 4, each leaf 4; equal leaves go by id.
    r = w.update(0, (0, 0, 5, 4, 1), (0, 0, 4, 4, 1))
    assert w.names(r.ids) == [(0, 3, 0, 0), (0, 2, 1, 1), (0, 1, 2, 2), (0, 0, 4, 4), (0, 0, 5, 4)]


@pytest.mark.parametrize("arrive", [False, True], ids=["in-flight", "arrived"])
def test_a_capped_chain_descends_one_tile_per_frame(arrive: bool) -> None:
    w = World(max_tiles=1)
    w.resident_levels(0, 4)
    got = []
    for f in range(5):
        r = w.update(f, (0, 0, 5, 4, 1))
        got.append(w.names(r.ids))
        if arrive:
            w.arrive(r.ids)
    assert got == [[(0, 3, 0, 0)], [(0, 2, 1, 1)], [(0, 1, 2, 2)], [(0, 0, 5, 4)], []]


def test_a_queued_child_is_not_issued_before_its_rescored_parent() -> None:
    """The parent's weight is recomputed from this frame's pages, its queued child keeps an older weight."""
    w = World()
    w.resident_levels(0, 4, 3, 2)
    w.update(0, (0, 0, 0, 0, 100), max_issue=0)  # queued: (1, 0, 0) and (0, 0, 0), weight 100 each
    assert w.sched.queued_count == 2
    # Now only a sibling under the same missing parent is wanted, with coverage 1.
    r = w.update(1, (0, 0, 1, 1, 1), max_issue=1)
    w.assert_parents_first(r.ids, set())
    assert w.names(r.ids) == [(0, 1, 0, 0)]


def test_a_queued_child_is_not_issued_before_its_parent_turned_prefetch() -> None:
    """The parent is this frame's prefetch neighbour of a wanted page, its queued child is still demand."""
    w = World(prefetch=True)
    w.resident_levels(0, 4, 3, 2)
    w.update(0, (0, 0, 0, 0, 1), max_issue=0)  # queued demand: (1, 0, 0) and (0, 0, 0)
    r = w.update(1, (0, 1, 1, 0, 5), max_issue=2)  # (1, 0, 0) is a neighbour of the wanted (1, 1, 0)
    w.assert_parents_first(r.ids, set())
    assert w.names(r.ids)[:2] == [(0, 1, 1, 0), (0, 1, 0, 0)]


# ---- priority -------------------------------------------------------------------------------------
def test_priority_by_coverage() -> None:
    w = World()
    w.resident_levels(0, 4, 3, 2, 1)
    assert w.issue(0, (0, 0, 0, 0, 5), (0, 0, 2, 2, 50), (0, 0, 4, 4, 20)) == [
        (0, 0, 2, 2),
        (0, 0, 4, 4),
        (0, 0, 0, 0),
    ]


def test_priority_by_level_gap() -> None:
    w = World()
    w.resident_levels(0, 4, 3)
    w.resident((0, 2, 0, 0), (0, 1, 0, 0))
    # Same coverage: (0, 0, 0) has its parent resident (gap 1, weight 10); (0, 9, 9) is 3 levels under
    # its resident ancestor (3, 1, 1) (gap 3, weight 30, like each tile of its chain).
    assert w.issue(0, (0, 0, 0, 0, 10), (0, 0, 9, 9, 10)) == [
        (0, 2, 2, 2),
        (0, 1, 4, 4),
        (0, 0, 9, 9),
        (0, 0, 0, 0),
    ]


def test_a_shared_parent_weighs_the_sum_of_its_children() -> None:
    w = World()
    w.resident_levels(0, 4, 3, 2)
    # (0, 8, 8) and (0, 9, 9) (4 x gap 2 each) share the missing parent (1, 4, 4): 16 beats (1, 1, 1)'s 12,
    # which ranks ahead of its equal child (0, 2, 2) (coarser first); equal leaves go by id.
    assert w.issue(0, (0, 0, 8, 8, 4), (0, 0, 9, 9, 4), (0, 0, 2, 2, 6)) == [
        (0, 1, 4, 4),
        (0, 1, 1, 1),
        (0, 0, 2, 2),
        (0, 0, 8, 8),
        (0, 0, 9, 9),
    ]


def test_zero_coverage_still_requests() -> None:
    w = World()
    w.resident_levels(0, 4, 3, 2, 1)
    assert w.issue(0, (0, 0, 3, 3, 0)) == [(0, 0, 3, 3)]


def test_each_cut_is_a_prefix_of_the_documented_order() -> None:
    """Demand, weight descending, coarser first, then id: the tiles a cap keeps are the first ones."""
    rng = np.random.default_rng(3)
    pages = [(0, 0, x, y, int(c)) for y in range(3) for x in range(16) for c in rng.integers(1, 4, 1)]
    expect = [p[:4] for p in sorted(pages, key=lambda p: (-p[4], p[3], p[2]))]  # id order is (y, x) on a level
    for cap in (1, 5, 12, 20, 33, 47, 48):
        w = World(max_tiles=cap)
        w.resident_levels(0, 4, 3, 2, 1)
        assert w.issue(0, *pages) == expect[:cap], f"cap {cap}"


# ---- caps -----------------------------------------------------------------------------------------
def ten_pages() -> list[Page]:
    return [(0, 0, x, 0, 100 - x) for x in range(10)]  # distinct weights: issued in x order


def test_tile_cap_and_max_issue() -> None:
    for max_tiles, max_issue, n in ((3, 100, 3), (100, 4, 4), (3, 5, 3), (5, 2, 2), (100, 100, 10)):
        w = World(max_tiles=max_tiles)
        w.resident_levels(0, 4, 3, 2, 1)
        r = w.update(0, *ten_pages(), max_issue=max_issue)
        assert w.names(r.ids) == [(0, 0, x, 0) for x in range(n)] and r.capped == 10 - n
        assert w.sched.max_tiles == max_tiles
    # The capped rest follows in later frames, in order, without being wanted again.
    w = World(max_tiles=4)
    w.resident_levels(0, 4, 3, 2, 1)
    got = [w.issue(0, *ten_pages())] + [w.issue(f) for f in (1, 2, 3)]
    assert got == [[(0, 0, x, 0) for x in xs] for xs in (range(4), range(4, 8), range(8, 10), [])]


def test_nothing_is_issued_with_no_room() -> None:
    w = World()
    w.resident_levels(0, 4, 3, 2, 1)
    for f, room in enumerate((0, -1)):
        r = w.update(f, *ten_pages(), max_issue=room)
        assert len(r) == 0 and r.capped == 10 and w.sched.queued_count == 10


def test_byte_cap() -> None:
    w = World(max_bytes=int(TILE * 4.5))
    w.resident_levels(0, 4, 3, 2, 1)
    assert w.sched.max_bytes == int(TILE * 4.5)
    r = w.update(0, *ten_pages())
    assert w.names(r.ids) == [(0, 0, x, 0) for x in range(4)] and r.capped == 6
    assert bytes_of(w, r.ids) == 4 * TILE
    # A cap below one tile still lets the best tile through (else nothing would ever load).
    w = World(max_bytes=TILE // 2)
    w.resident_levels(0, 4, 3, 2, 1)
    r = w.update(0, *ten_pages())
    assert w.names(r.ids) == [(0, 0, 0, 0)] and r.capped == 9


def test_two_textures_share_the_caps_and_bytes_use_each_tile_size() -> None:
    def world(**kw: int) -> World:
        w = World({0: HEADER, 1: BIG}, **kw)
        w.resident_levels(0, 4, 3, 2, 1)
        w.resident_levels(1, 5)
        return w

    # tex 1's (4, 1, 1) is one level under its resident ancestor: weight 40.
    pages = [(0, 0, 0, 0, 50), (1, 4, 1, 1, 40), (0, 0, 1, 0, 30), (0, 0, 2, 0, 20)]
    best = [(0, 0, 0, 0), (1, 4, 1, 1), (0, 0, 1, 0), (0, 0, 2, 0)]
    assert world().issue(0, *pages) == best
    w = world(max_bytes=2 * TILE + BIG_TILE)
    r = w.update(0, *pages)
    assert w.names(r.ids) == best[:3] and r.capped == 1 and bytes_of(w, r.ids) == 2 * TILE + BIG_TILE
    # One byte less: the third tile no longer fits (it would if every tile were TILE bytes).
    assert world(max_bytes=2 * TILE + BIG_TILE - 1).issue(0, *pages) == best[:2]
    assert world(max_tiles=2).issue(0, *pages) == best[:2]
    assert world(max_tiles=3).issue(0, *pages, max_issue=1) == best[:1]


# ---- cancel ---------------------------------------------------------------------------------------
def test_stale_requests_are_cancelled() -> None:
    w = World(cancel_after_frames=4)
    w.resident_levels(0, 4, 3, 2, 1)
    r = w.update(0, (0, 0, 0, 0, 9), (0, 0, 2, 2, 5), (0, 0, 4, 4, 1), max_issue=1)
    assert w.names(r.ids) == [(0, 0, 0, 0)] and r.capped == 2
    for f in (1, 2):  # no room
        r = w.update(f, max_issue=0)
        assert (len(r), r.capped, r.cancelled) == (0, 2, 0)
    w.update(3, (0, 0, 4, 4, 1), max_issue=0)  # wanted again: its clock restarts
    r = w.update(4, max_issue=0)
    assert (r.cancelled, r.capped) == (1, 1) and w.names(w.sched.queue) == [(0, 0, 4, 4)]
    assert w.update(6, max_issue=0).cancelled == 0
    r = w.update(7, max_issue=0)
    assert (r.cancelled, r.capped, w.sched.queued_count) == (1, 0, 0)
    assert w.sched.stats.cancelled == 2 and w.sched.stats.frames == 7
    # A cancelled tile is requested again as soon as it is wanted again.
    assert w.issue(8, (0, 0, 2, 2, 1)) == [(0, 0, 2, 2)]


def test_stale_requests_are_cancelled_even_when_room_remains() -> None:
    w = World(cancel_after_frames=2, max_tiles=1)
    w.resident_levels(0, 4, 3, 2, 1)
    assert w.issue(0, (0, 0, 0, 0, 9), (0, 0, 2, 2, 5), (0, 0, 4, 4, 1)) == [(0, 0, 0, 0)]
    assert w.issue(1) == [(0, 0, 2, 2)]
    r = w.update(2)
    assert len(r) == 0 and r.cancelled == 1 and w.sched.queued_count == 0


# ---- prefetch -------------------------------------------------------------------------------------
def test_prefetch_neighbours_and_children_after_demand() -> None:
    w = World(prefetch=True)
    w.resident_levels(0, 4, 3, 2)
    w.resident((0, 1, 2, 2))
    # (1, 2, 2) is resident (coverage 10); (0, 0, 0) misses itself and its parent (weight 1 x gap 2).
    r = w.update(0, (0, 1, 2, 2, 10), (0, 0, 0, 0, 1))
    assert w.names(r.ids) == [
        (0, 1, 0, 0),  # demand first, whatever its weight
        (0, 0, 0, 0),
        (0, 1, 2, 1),  # the neighbours of (1, 2, 2), by id
        (0, 1, 1, 2),
        (0, 1, 3, 2),
        (0, 1, 2, 3),
        (0, 0, 4, 4),  # its children (finer: after the neighbours of equal weight)
        (0, 0, 5, 4),
        (0, 0, 4, 5),
        (0, 0, 5, 5),
    ]
    # (0, 0, 0)'s neighbours (1, 0) and (0, 1) are not prefetched: their parent (1, 0, 0) is missing.
    assert r.prefetch.tolist() == [False] * 2 + [True] * 8
    assert (w.sched.stats.issued, w.sched.stats.issued_prefetch) == (10, 8)


def test_prefetch_weights_add_up_and_skip_resident_and_in_flight_tiles() -> None:
    w = World(prefetch=True)
    w.resident_levels(0, 4, 3, 2, 1)
    w.resident((0, 0, 3, 3), (0, 0, 5, 3), (0, 0, 4, 2))
    w.in_flight.add(w.id(0, 0, 3, 4))
    # Neighbours of three resident wanted pages; (0, 4, 3) neighbours all three (5 + 2 + 1), (0, 3, 2) two
    # (5 + 1); (0, 3, 4) is in flight; the wanted pages themselves are resident.
    r = w.update(0, (0, 0, 3, 3, 5), (0, 0, 5, 3, 2), (0, 0, 4, 2, 1))
    assert w.names(r.ids) == [
        (0, 0, 4, 3),  # 8
        (0, 0, 3, 2),  # 6
        (0, 0, 2, 3),  # 5
        (0, 0, 5, 2),  # 2 + 1
        (0, 0, 6, 3),  # 2, then by id
        (0, 0, 5, 4),  # 2
        (0, 0, 4, 1),  # 1
    ]
    assert r.prefetch.all()


def test_no_prefetch_when_disabled() -> None:
    w = World(prefetch=False)
    w.resident_levels(0, 4, 3, 2)
    w.resident((0, 1, 2, 2))
    assert len(w.update(0, (0, 1, 2, 2, 10))) == 0 and w.sched.queued_count == 0


def test_prefetch_stays_inside_the_grid() -> None:
    w = World(prefetch=True)
    w.resident_levels(0, 4, 3, 2, 1)
    w.resident((0, 0, 15, 10))
    r = w.update(0, (0, 0, 15, 10, 3))
    assert set(w.names(r.ids)) == {(0, 0, 14, 10), (0, 0, 15, 9)} and len(r) == 2 and r.prefetch.all()


def test_prefetch_only_when_demand_leaves_room() -> None:
    def world(max_tiles: int) -> World:
        w = World(prefetch=True, max_tiles=max_tiles)
        w.resident_levels(0, 4, 3, 2)
        w.resident((0, 1, 2, 2))
        return w

    pages = [(0, 1, 2, 2, 10), (0, 0, 0, 0, 1)]  # demand: a chain of 2 tiles
    w = world(2)
    r = w.update(0, *pages)
    assert w.names(r.ids) == [(0, 1, 0, 0), (0, 0, 0, 0)] and r.capped == 0 and w.sched.queued_count == 0
    w = world(3)
    r = w.update(0, *pages)
    assert w.names(r.ids) == [(0, 1, 0, 0), (0, 0, 0, 0), (0, 1, 2, 1)] and r.prefetch.tolist() == [False, False, True]
    assert r.capped == 7  # the other prefetch tiles wait for the next frames


# ---- failures -------------------------------------------------------------------------------------
def test_failed_tiles_retry_with_doubling_back_off() -> None:
    w = World(retry_frames=10)
    w.resident_levels(0, 4, 3, 2, 1)
    page = (0, 0, 3, 3, 1)
    k = w.ids((0, 0, 3, 3))
    issued = []
    for f in range(100):
        if len(w.update(f, page)):
            issued.append(f)
            w.drop(k)
            w.sched.mark_failed(k, f)
            assert w.sched.failed_count == 1 and w.sched.queued_count == 0
    assert issued == [0, 10, 30, 70]  # back-off 10, 20, 40 frames
    assert (w.sched.stats.failed, w.sched.stats.retried) == (4, 3)


def test_success_clears_the_failure_history() -> None:
    w = World(retry_frames=10)
    w.resident_levels(0, 4, 3, 2, 1)
    page = (0, 0, 3, 3, 1)
    k = w.ids((0, 0, 3, 3))
    w.sched.mark_failed(k, 0)
    w.sched.mark_failed(k, 0)  # twice: next try at 20
    assert [f for f in range(25) if len(w.update(f, page))] == [20]
    w.arrive(k)
    assert w.sched.failed_count == 0
    w.tables.set_absent(k)  # evicted later, then fails once: back to the first back-off
    w.sched.mark_failed(k, 30)
    assert [f for f in range(30, 45) if len(w.update(f, page))] == [40]


def test_a_failed_queued_tile_leaves_the_queue() -> None:
    w = World(retry_frames=5)
    w.resident_levels(0, 4, 3, 2, 1)
    w.update(0, (0, 0, 1, 1, 1), (0, 0, 2, 2, 1), max_issue=0)
    w.sched.mark_failed(w.ids((0, 0, 1, 1)), 0)
    r = w.update(1, max_issue=0)
    assert (r.capped, r.cancelled) == (1, 0) and w.names(w.sched.queue) == [(0, 0, 2, 2)]


def test_a_failed_parent_does_not_block_its_children() -> None:
    w = World(retry_frames=10)
    w.resident_levels(0, 4, 3, 2)
    w.sched.mark_failed(w.ids((0, 1, 0, 0)), frame=0)
    assert w.issue(1, (0, 0, 1, 1, 1)) == [(0, 0, 1, 1)]
    assert w.issue(10, (0, 0, 1, 1, 1)) == [(0, 1, 0, 0)]  # its back-off is over


# ---- frames, closing, growth ----------------------------------------------------------------------
def test_frames_must_not_go_back() -> None:
    w = World()
    w.update(5)
    w.update(5)
    with pytest.raises(ValueError, match="frame 4"):
        w.update(4)
    with pytest.raises(ValueError, match="upload_tiles_per_frame"):
        World(max_tiles=0)


def test_forget_drops_what_is_known_about_a_closed_texture() -> None:
    w = World({0: HEADER, 1: HEADER}, retry_frames=100)
    for tex in (0, 1):
        w.resident_levels(tex, 4, 3, 2, 1)
    w.update(0, (0, 0, 0, 0, 1), (1, 0, 0, 0, 1), (0, 0, 1, 0, 1), max_issue=0)
    w.sched.mark_failed(w.ids((0, 0, 5, 5)), 0)
    assert (w.sched.queued_count, w.sched.failed_count) == (3, 1)
    rng = w.space.ranges[0]
    w.sched.forget(rng.start, rng.stop)
    assert w.names(w.sched.queue) == [(1, 0, 0, 0)] and w.sched.failed_count == 0
    # The range is reused by the next texture: nothing of texture 0 carries over.
    w.tables.remove_texture(0)
    w.space.unregister(0)
    w.add(2, HEADER)
    assert w.space.ranges[2].start == rng.start
    w.resident_levels(2, 4, 3, 2, 1)
    assert w.issue(1, (2, 0, 5, 5, 1)) == [(2, 0, 5, 5), (1, 0, 0, 0)]


def test_textures_opened_after_the_scheduler_grow_its_state() -> None:
    w = World(space=TileSpace(capacity=300))
    w.resident_levels(0, 4)
    w.add(1, BIG)
    assert w.space.capacity > 300
    w.resident_levels(1, 5)
    w.update(0, (0, 0, 0, 0, 1), (1, 0, 31, 31, 1), max_issue=0)
    w.sched.mark_failed(w.ids((1, 3, 3, 3)), 0)
    r = w.update(1)
    # nothing wanted in frame 1: the queued chains go coarser first (their weights are a frame old)
    assert w.names(r.ids) == [
        (1, 4, 1, 1),
        (0, 3, 0, 0),
        (0, 2, 0, 0),
        (1, 2, 7, 7),
        (0, 1, 0, 0),
        (1, 1, 15, 15),
        (0, 0, 0, 0),
        (1, 0, 31, 31),
    ]


# ---- simulation -----------------------------------------------------------------------------------
def test_simulated_streaming_converges_without_reissuing() -> None:
    """Drifting then still wanted pages over two textures, random latencies and room: every issued tile
    is missing, not in flight, under the caps, after its parent, issued once; in the end all is resident."""
    rng = np.random.default_rng(42)
    w = World({0: HEADER, 1: BIG}, max_tiles=6, max_bytes=4 * BIG_TILE, prefetch=True, cancel_after_frames=3)
    w.resident_levels(0, 4)
    w.resident_levels(1, 5)
    landing: dict[int, int] = {}
    issued: set[int] = set()

    def view(cx: int, cy: int) -> list[Page]:
        pages = []
        for dx in range(3):
            for dy in range(3):
                lv = int(rng.integers(0, 3))
                pages.append((0, lv, min(cx + dx, 15) >> lv, min(cy + dy, 10) >> lv, int(rng.integers(1, 50))))
                lv = int(rng.integers(0, 4))
                pages.append((1, lv, (2 * cx + dx) >> lv, (2 * cy + dy) >> lv, int(rng.integers(1, 50))))
        return pages

    cx, cy = 5, 5
    still = view(cx, cy)
    for frame in range(400):
        done = [k for k, at in landing.items() if at <= frame]
        for k in done:
            del landing[k]
        if done:
            w.arrive(np.array(done))
        if frame < 60:  # the camera drifts, then stops
            if rng.random() < 0.3:
                cx = int(np.clip(cx + rng.integers(-1, 2), 0, 13))
                cy = int(np.clip(cy + rng.integers(-1, 2), 0, 8))
            pages = view(cx, cy)
        else:
            pages = still
        before = set(w.in_flight)
        r = w.update(frame, *pages, max_issue=int(rng.integers(0, 9)))
        ids = r.ids.tolist()
        assert len(set(ids)) == len(ids) and not issued & set(ids), "a tile was issued twice"
        assert not before & set(ids) and not w.tables.is_resident(r.ids).any()
        assert len(ids) <= 6 and (len(ids) <= 1 or bytes_of(w, r.ids) <= 4 * BIG_TILE)
        if frame >= 60 + 3:  # drift's queued tiles are cancelled; the rest is rescored every frame (see
            w.assert_parents_first(r.ids, before)  # test_a_queued_child_is_not_issued_before_its_rescored_parent)
        issued.update(ids)
        for k in ids:
            landing[k] = frame + int(rng.integers(1, 4))
        wanted = w.want(*still)
        if frame > 60 and not landing and not w.sched.queued_count and w.tables.is_resident(wanted.ids).all():
            break
    else:
        pytest.fail("streaming did not converge in 400 frames")
    assert w.sched.stats.issued == len(issued) and w.sched.stats.issued_prefetch > 0
    assert len(w.update(frame + 1, *still)) == 0
    for tex in (0, 1):
        w.tables.validate(tex)


# ---- a still view: nothing to ask for, until something changes -------------------------------------
def still_world(**config: object) -> tuple[World, list[Page]]:
    """Every tile resident, a view of two pages at level 0 (what a converged, still camera sees)."""
    w = World(**config)
    w.resident_levels(0, 0, 4)
    return w, [(0, 0, 3, 3, 5), (0, 0, 4, 3, 2)]


@pytest.mark.parametrize("prefetch", [False, True])
def test_a_still_view_that_loses_a_tile_asks_for_it_again(prefetch: bool) -> None:
    w, view = still_world(prefetch=prefetch)
    for frame in range(4):  # quiet frames: nothing missing, nothing to prefetch
        assert len(w.update(frame, *view)) == 0
    w.tables.set_absent(w.ids((0, 0, 4, 3)))  # evicted while the view stays
    assert w.issue(4, *view) == [(0, 0, 4, 3)]


def test_a_still_view_asks_for_prefetch_that_an_eviction_opened() -> None:
    w, view = still_world(prefetch=True)
    for frame in range(4):
        assert len(w.update(frame, *view)) == 0
    w.tables.set_absent(w.ids((0, 0, 5, 3)))  # a neighbour of a wanted page, not wanted itself
    r = w.update(4, *view)
    assert w.names(r.ids) == [(0, 0, 5, 3)] and r.prefetch.tolist() == [True]


def test_quiet_frames_react_to_new_feedback_and_to_a_texture_opened() -> None:
    w, view = still_world()
    w.tables.set_absent(w.ids((0, 0, 9, 9)))
    for frame in range(3):
        assert len(w.update(frame, *view)) == 0
    assert w.issue(3, *view, (0, 0, 9, 9, 1)) == [(0, 0, 9, 9)]  # the view moved onto a missing tile
    w.arrive(w.ids((0, 0, 9, 9)))
    assert len(w.update(4, *view)) == 0
    w.add(1, HEADER)  # a texture opened: nothing of it is resident
    assert w.issue(5, *view, (1, 4, 0, 0, 1)) == [(1, 4, 0, 0)]
    assert w.sched.stats.frames == 6  # quiet frames are frames of the scheduler too


def test_a_quiet_view_with_a_failed_tile_retries_it_after_its_back_off() -> None:
    w, view = still_world(retry_frames=4)
    tile = w.ids((0, 0, 4, 3))
    w.tables.set_absent(tile)
    assert w.issue(0, *view) == [(0, 0, 4, 3)]
    w.drop(tile)
    w.sched.mark_failed(tile, 0)
    issued = [len(w.update(frame, *view)) for frame in range(1, 8)]
    assert issued == [0, 0, 0, 1, 0, 0, 0]  # retried once its back-off ended (frame 4), not before


# ---- a new view: the wanted pages' neighbours -------------------------------------------------------
def test_a_widened_view_wants_the_eight_same_level_neighbours_inside_each_grid() -> None:
    """Level 0 of HEADER is 16 x 11 tiles: a page in the middle brings its eight neighbours, one in a
    corner its three; a second texture's pages stay in their own grid; coverage stays where it was,
    new pages count once."""
    w = World({0: HEADER, 1: BIG})
    wanted = w.want((0, 0, 5, 5, 7), (0, 0, 0, 0, 3), (0, 2, 3, 2, 2), (1, 1, 15, 0, 4))
    got = w.sched.widened(wanted)
    assert (np.diff(got.ids) > 0).all()
    names = dict(zip(w.names(got.ids), got.counts.tolist(), strict=True))
    middle = {(0, 0, 5 + dx, 5 + dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1)}
    corner = {(0, 0, x, y) for x in (0, 1) for y in (0, 1)}
    last = {(0, 2, x, y) for x in (2, 3) for y in (1, 2)}  # level 2 is 4 x 3 tiles: (3, 2) is its last
    edge = {(1, 1, x, y) for x in (14, 15) for y in (0, 1)}  # BIG's level 1 is 16 x 16 tiles
    assert set(names) == middle | corner | last | edge
    assert names[(0, 0, 5, 5)] == 7 and names[(0, 0, 0, 0)] == 3 and names[(0, 2, 3, 2)] == 2
    assert names[(1, 1, 15, 0)] == 4 and names[(0, 0, 6, 6)] == 1 and names[(1, 1, 14, 1)] == 1


def test_widen_requests_the_neighbours_of_a_new_view_as_demand() -> None:
    """With `widen` a frame's demand takes the neighbours too, parents first, and not as prefetch
    (which waits for spare slots); without it only the pages themselves and their missing parents."""
    for widen in (False, True):
        w = World()
        w.resident_levels(0, 3, 4)
        r = w.sched.update(0, w.want((0, 0, 8, 5, 10)), 1 << 20, widen=widen)
        got = set(w.names(r.ids))
        chain = {(0, 0, 8, 5), (0, 1, 4, 2), (0, 2, 2, 1)}
        assert chain <= got and not r.prefetch.any()
        neighbours = {(0, 0, 8 + dx, 5 + dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1)}
        assert (neighbours <= got) is widen and (neighbours & got == {(0, 0, 8, 5)}) is not widen
        w.assert_parents_first(r.ids, set())


def test_widen_leaves_ids_of_no_tile_alone_and_skips_views_larger_than_a_frames_loads() -> None:
    """An id between two textures' ranges names no tile and brings no neighbours; a view wanting more
    pages than the request cap is not widened (its next feedback comes before the neighbours would)."""
    w = World({0: HEADER, 1: BIG}, max_tiles=12)
    hole = w.space.ranges[0].stop  # the id past texture 0's tiles names none
    assert not w.space.is_tile(np.array([hole]))[0]
    got = w.sched.widened(Wanted(np.array([w.id(0, 0, 5, 5), hole], np.int64), np.array([2, 3], np.int64)))
    assert got.ids.size == 9 + 1 and hole in got.ids.tolist()
    w.resident_levels(0, 2, 3, 4)
    small = w.want((0, 1, 2, 2, 1))
    assert w.sched.update(0, small, 1 << 20, widen=True).ids.size == 9  # the page and its eight neighbours
    large = w.want(*[(0, 0, x, 0, 1) for x in range(13)])  # 13 pages > 12: not widened
    r = w.sched.update(1, large, 1 << 20, widen=True)
    asked = set(w.names(np.concatenate([r.ids, w.sched.queue])))  # issued now or queued for later
    assert asked == {(0, 0, x, 0) for x in range(13)} | {(0, 1, x, 0) for x in range(7)}  # pages, parents
