"""TileSpace: id ranges per texture, (texture, level, x, y) <-> id, parents, reuse and growth of the space."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from texstream.pack.format import PackHeader
from texstream.runtime.tiles import HEADER, TileRange, TileSpace


def hdr(w: int, h: int, t: int = 64) -> PackHeader:
    return PackHeader(width=w, height=h, tile_size=t)


# Tile counts (levels) of the headers used below, for reading the expected ranges.
TINY = hdr(64, 64)  # 1 tile: 17 ids
MID = hdr(300, 200)  # 5x4, 3x2, 2x1, 1x1: 29 tiles, 45 ids
BIG = hdr(1000, 700)  # 16x11, 8x6, 4x3, 2x2, 1x1: 241 tiles, 257 ids

SIZES = [
    (1000, 700, 64),
    (64 * 13 + 5, 64 * 7 - 3, 64),
    (70, 3000, 64),
    (3000, 17, 128),
    (100000, 3, 256),
    (64, 64, 64),
    (1, 1, 64),
    (65, 129, 64),
    (4096, 4096, 64),
]


def tiles_of(h: PackHeader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(level, x, y) of every tile of `h`, in pack index order (level-major, then row-major)."""
    lv, xs, ys = [], [], []
    for k in range(h.level_count):
        tx, ty = h.tiles_in_level(k)
        yy, xx = np.mgrid[0:ty, 0:tx]
        lv.append(np.full(tx * ty, k))
        xs.append(xx.ravel())
        ys.append(yy.ravel())
    return np.concatenate(lv), np.concatenate(xs), np.concatenate(ys)


def test_sizes_used_by_these_tests() -> None:
    assert (TINY.tile_count, MID.tile_count, BIG.tile_count) == (1, 29, 241)
    assert [BIG.tiles_in_level(k) for k in range(BIG.level_count)] == [(16, 11), (8, 6), (4, 3), (2, 2), (1, 1)]


# ---- ranges -----------------------------------------------------------------------------------------------------


def test_ranges_are_contiguous_and_start_with_header_entries() -> None:
    space = TileSpace()
    assert space.used == 0 and space.ranges == {}
    r0 = space.register(3, BIG)
    r1 = space.register(0, MID)
    assert r0 == TileRange(3, 0, HEADER + 241)
    assert r1 == TileRange(0, r0.stop, r0.stop + HEADER + 29)
    assert (r0.first_tile, r0.tile_count) == (HEADER, 241)
    assert (r1.first_tile, r1.tile_count) == (r0.stop + HEADER, 29)
    assert space.ranges == {3: r0, 0: r1}
    assert space.used == r1.stop
    for tex, r, h in ((3, r0, BIG), (0, r1, MID)):
        everything = np.arange(r.start, r.stop)
        tile = space.is_tile(everything)
        assert not tile[:HEADER].any() and tile[HEADER:].all()  # header entries are not tiles
        np.testing.assert_array_equal(space.tex[r.start : r.first_tile], -1)
        np.testing.assert_array_equal(space.tex[r.first_tile : r.stop], tex)
        # The ids of the texture's tiles are exactly first_tile..stop, each once.
        ids = space.ids(tex, *tiles_of(h))
        np.testing.assert_array_equal(np.sort(ids), np.arange(r.first_tile, r.stop))
        np.testing.assert_array_equal(np.sort(space.tile_ids(tex)), np.arange(r.first_tile, r.stop))
    assert not space.is_tile(np.arange(space.used, space.capacity)).any()


def test_level_tables_follow_the_pack() -> None:
    space = TileSpace()
    space.register(1, MID)
    r = space.register(200, BIG)
    assert space.level_count[200] == BIG.level_count and space.level_count[5] == 0
    assert space.tile_bytes[200] == BIG.tile_raw_size
    for k in range(BIG.level_count):
        assert space.level_first[200, k] == r.first_tile + int(BIG.level_first[k])
        assert (space.tiles_x[200, k], space.tiles_y[200, k]) == BIG.tiles_in_level(k)
    assert not space.tiles_x[200, BIG.level_count :].any() and not space.tiles_y[200, BIG.level_count :].any()


def test_unregister_frees_the_range_and_first_fit_reuses_it() -> None:
    space = TileSpace()
    r0 = space.register(0, BIG)  # 0..257
    r1 = space.register(1, MID)  # 257..302
    r2 = space.register(2, MID)  # 302..347
    r3 = space.register(3, MID)  # 347..392
    assert [(r.start, r.stop) for r in (r0, r1, r2, r3)] == [(0, 257), (257, 302), (302, 347), (347, 392)]
    assert space.unregister(0) == r0 and space.unregister(2) == r2
    assert space.unregister(2) is None  # already free
    assert not space.is_tile(np.arange(r0.start, r0.stop)).any()
    assert not space.is_tile(np.arange(r2.start, r2.stop)).any()
    assert space.is_tile(np.arange(r1.first_tile, r1.stop)).all()
    assert space.used == 392
    with pytest.raises(ValueError, match="texture id 0"):
        space.tile_ids(0)
    with pytest.raises(ValueError, match=r"\(2, 0, 0, 0\)"):
        space.ids(2, 0, 0, 0)
    assert not space.contains(np.array([0]), np.array([0]), np.array([0]), np.array([0]))[0]
    # Gaps now: 0..257 and 302..347. First fit takes the first gap large enough, not the tightest one.
    r4 = space.register(4, MID)
    assert (r4.start, r4.stop) == (0, 45)
    r5 = space.register(5, BIG)  # 45..257 and 302..347 are too small: after the last range
    assert (r5.start, r5.stop) == (392, 649)
    r6 = space.register(6, TINY)
    assert (r6.start, r6.stop) == (45, 62)
    r7 = space.register(7, MID)  # 62..257 still comes before the exact fit 302..347
    assert (r7.start, r7.stop) == (62, 107)
    assert space.used == 649
    # A texture id can be registered again once it is free.
    r0b = space.register(0, TINY)
    assert (r0b.start, r0b.stop) == (107, 124)
    assert space.tile_ids(0).tolist() == [107 + HEADER]
    assert [int(c[0]) for c in space.coords(np.array([107 + HEADER]))] == [0, 0, 0, 0]
    # Unregistering the last range lowers `used`.
    space.unregister(5)
    assert space.used == 392
    # Every live texture still maps its own tiles.
    for tex, h in ((1, MID), (3, MID), (4, MID), (6, TINY), (7, MID), (0, TINY)):
        r = space.ranges[tex]
        np.testing.assert_array_equal(np.sort(space.ids(tex, *tiles_of(h))), np.arange(r.first_tile, r.stop))
        np.testing.assert_array_equal(space.tex[r.first_tile : r.stop], tex)


def test_growth_calls_listeners_and_keeps_ids() -> None:
    space = TileSpace(capacity=64)
    seen: list[tuple[int, int, int]] = []
    space.add_listener(lambda cap: seen.append((cap, space.capacity, space.tex.size)))
    calls: list[int] = []
    space.add_listener(calls.append)
    space.register(0, TINY)  # 0..17
    space.register(1, MID)  # 17..62: still fits 64
    assert calls == [] and space.capacity == 64
    before = {t: space.ids(t, *tiles_of(h)) for t, h in ((0, TINY), (1, MID))}
    space.register(2, TINY)  # 62..79: doubles to 128
    assert calls == [128] and space.capacity == 128
    assert seen == [(128, 128, 128)]  # the space has grown when the listener runs
    space.register(3, BIG)  # 79..336: more than double: exactly what is needed
    assert calls == [128, 336] and space.capacity == 336
    assert space.tex.size == space.level.size == space.parent.size == 336
    for t, h in ((0, TINY), (1, MID)):
        ids = space.ids(t, *tiles_of(h))
        np.testing.assert_array_equal(ids, before[t])
        assert space.is_tile(ids).all()
        got = space.coords(ids)
        np.testing.assert_array_equal(got[0], t)
        for a, b in zip(got[1:], tiles_of(h), strict=True):
            np.testing.assert_array_equal(a, b)
    space.unregister(1)
    space.register(4, MID)  # reuses the freed range: no growth
    assert calls == [128, 336]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="0"):
        TileSpace(capacity=0)


# ---- ids and coordinates -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("w", "h", "t"), SIZES)
def test_ids_and_coords_round_trip_beside_other_textures(w: int, h: int, t: int) -> None:
    space = TileSpace(capacity=16)
    others = {0: MID, 255: hdr(700, 300, 128)}
    space.register(0, others[0])
    header = hdr(w, h, t)
    r = space.register(17, header)
    space.register(255, others[255])
    for tex, hd in ((17, header), *others.items()):
        lv, x, y = tiles_of(hd)
        ids = space.ids(tex, lv, x, y)
        rng = space.ranges[tex]
        assert ids.dtype == np.int64 and ids.shape == lv.shape
        expect = np.array([hd.tile_index(*c) for c in zip(lv.tolist(), x.tolist(), y.tolist(), strict=True)])
        np.testing.assert_array_equal(ids, rng.first_tile + expect)
        np.testing.assert_array_equal(space.pack_index(ids), expect)
        got = space.coords(ids)
        for a, b in zip(got, (np.full(ids.size, tex), lv, x, y), strict=True):
            np.testing.assert_array_equal(a, b)
        assert space.contains(np.full(ids.size, tex), lv, x, y).all()
        assert space.is_tile(ids).all()
    # One call over tiles of several textures at once.
    mixed = np.concatenate([space.tile_ids(17)[-3:], space.tile_ids(0)[:5], space.tile_ids(255)[::7]])
    tex, lv, x, y = space.coords(mixed)
    np.testing.assert_array_equal(space.ids(tex, lv, x, y), mixed)
    assert space.level_first[17, 0] == r.first_tile


def test_scalar_arguments() -> None:
    space = TileSpace()
    r = space.register(9, BIG)
    assert int(space.ids(9, 1, 7, 5)) == r.first_tile + BIG.tile_index(1, 7, 5)
    assert bool(space.is_tile(r.first_tile)) and not bool(space.is_tile(r.start))
    assert int(space.ancestors(space.ids(9, 0, 15, 10), 2)) == int(space.ids(9, 2, 3, 2))


@pytest.mark.parametrize(("w", "h", "t"), SIZES)
def test_parents_and_ancestors(w: int, h: int, t: int) -> None:
    space = TileSpace()
    space.register(1, MID)
    header = hdr(w, h, t)
    space.register(2, header)
    top = header.level_count - 1
    lv, x, y = tiles_of(header)
    ids = space.ids(2, lv, x, y)
    up = lv < top
    np.testing.assert_array_equal(space.parent[ids[up]], space.ids(2, lv[up] + 1, x[up] >> 1, y[up] >> 1))
    np.testing.assert_array_equal(space.parent[ids[~up]], -1)
    for n in range(top + 3):
        k = np.minimum(lv + n, top)  # clamped at the coarsest level
        expect = space.ids(2, k, x >> (k - lv), y >> (k - lv))
        np.testing.assert_array_equal(space.ancestors(ids, n), expect, err_msg=f"{n} levels up")


def test_tile_ids_are_coarsest_first_and_filter_levels() -> None:
    space = TileSpace()
    space.register(0, TINY)
    r = space.register(4, BIG)
    f = r.first_tile
    all_ids = space.tile_ids(4)
    assert all_ids.dtype == np.int64
    np.testing.assert_array_equal(all_ids[:1], [f + 240])  # level 4: the 1x1 top
    np.testing.assert_array_equal(all_ids[1:5], np.arange(f + 236, f + 240))  # level 3: 2x2
    np.testing.assert_array_equal(all_ids[-176:], np.arange(f, f + 176))  # level 0: 16x11
    lv = space.coords(all_ids)[1]
    assert (np.diff(lv) <= 0).all()
    two = space.tile_ids(4, range(0, 2))
    np.testing.assert_array_equal(two, np.concatenate([np.arange(f + 176, f + 224), np.arange(f, f + 176)]))
    assert space.tile_ids(4, range(10, 12)).size == 0
    with pytest.raises(ValueError, match="texture id 7"):
        space.tile_ids(7)


def test_is_tile_rejects_headers_freed_and_out_of_range_ids() -> None:
    space = TileSpace(capacity=600)
    a = space.register(0, BIG)
    b = space.register(1, MID)
    c = space.register(2, MID)
    space.unregister(1)
    probe = np.array(
        [
            -5,
            -1,
            a.start,
            a.first_tile - 1,
            a.first_tile,
            a.stop - 1,
            b.start,
            b.first_tile,
            b.stop - 1,
            c.start + 3,
            c.first_tile,
            c.stop,
            space.capacity - 1,
            space.capacity,
            10**9,
        ]
    )
    expect = [False, False, False, False, True, True, False, False, False, False, True, False, False, False, False]
    assert space.is_tile(probe).tolist() == expect
    assert space.is_tile(probe.reshape(3, 5)).tolist() == np.reshape(expect, (3, 5)).tolist()


def test_contains_checks_every_coordinate() -> None:
    space = TileSpace()
    space.register(5, BIG)  # level 0 is 16x11, level 4 the top
    cases = [
        ((5, 0, 15, 10), True),
        ((5, 4, 0, 0), True),
        ((5, 0, 16, 0), False),
        ((5, 0, 0, 11), False),
        ((5, 0, -1, 0), False),
        ((5, 0, 0, -1), False),
        ((5, 5, 0, 0), False),
        ((5, 16, 0, 0), False),
        ((5, -1, 0, 0), False),
        ((5, 3, 2, 0), False),
        ((4, 0, 0, 0), False),
        ((-1, 0, 0, 0), False),
        ((256, 0, 0, 0), False),
    ]
    cols = [np.array(c) for c in zip(*(c for c, _ in cases), strict=True)]
    assert space.contains(*cols).tolist() == [ok for _, ok in cases]


# ---- bad arguments --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tex", [-1, 256, 1000])
def test_register_rejects_texture_ids_outside_0_255(tex: int) -> None:
    space = TileSpace()
    with pytest.raises(ValueError, match=str(tex)):
        space.register(tex, MID)
    assert space.ranges == {} and space.used == 0


def test_register_rejects_a_duplicate() -> None:
    space = TileSpace()
    r = space.register(3, MID)
    with pytest.raises(ValueError, match="texture id 3"):
        space.register(3, TINY)
    assert space.ranges == {3: r} and space.used == r.stop


def test_register_takes_16_levels_and_rejects_17() -> None:
    space = TileSpace()
    sixteen = hdr(1 << 21, 1)  # 2^15 x 1 tiles at level 0 ... 1 x 1 at level 15
    assert sixteen.level_count == 16
    r = space.register(0, sixteen)
    assert space.level_count[0] == 16 and r.tile_count == sixteen.tile_count
    assert int(space.ids(0, 15, 0, 0)) == r.stop - 1
    with pytest.raises(ValueError, match="17 levels"):  # the pack format refuses what page tables cannot hold
        hdr((1 << 21) + 1, 1)
    assert 1 not in space.ranges and space.used == r.stop


def test_ids_name_the_missing_tile() -> None:
    space = TileSpace()
    space.register(0, BIG)
    with pytest.raises(ValueError, match=r"\(0, 0, 16, 0\) does not exist"):
        space.ids(0, 0, 16, 0)
    with pytest.raises(ValueError, match=r"\(0, 5, 0, 0\)"):
        space.ids(0, 5, 0, 0)
    with pytest.raises(ValueError, match=r"\(3, 0, 0, 0\)"):
        space.ids(3, 0, 0, 0)
    with pytest.raises(ValueError, match=r"\(0, 2, 1, 3\)"):  # the first bad one of a batch
        space.ids(0, np.array([0, 2, 2, 9]), np.array([0, 1, 1, 0]), np.array([0, 2, 3, 0]))


# ---- random register/unregister sequences against a first-fit model ---------------------------------------------

HEADERS = [TINY, MID, BIG, hdr(200, 450), hdr(700, 300, 128), hdr(130, 70)]


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, len(HEADERS) - 1)), max_size=25),
    capacity=st.integers(1, 300),
)
def test_random_register_unregister_follow_first_fit(ops: list[tuple[int, int]], capacity: int) -> None:
    space = TileSpace(capacity=capacity)
    grown: list[int] = []
    space.add_listener(grown.append)
    model: dict[int, tuple[int, int, PackHeader]] = {}  # tex -> (start, stop, header)
    for tex, which in ops:
        if tex in model:
            start, stop, _ = model.pop(tex)
            assert space.unregister(tex) == TileRange(tex, start, stop)
            continue
        header = HEADERS[which]
        size = HEADER + header.tile_count
        at = 0
        for s, e, _ in sorted(model.values(), key=lambda v: v[0]):
            if s - at >= size:
                break
            at = e
        cap = space.capacity
        r = space.register(tex, header)
        assert (r.start, r.stop) == (at, at + size)
        if at + size > cap:
            assert grown[-1] == space.capacity == max(at + size, 2 * cap)
        model[tex] = (r.start, r.stop, header)
    assert grown == sorted(grown) and space.capacity >= space.used
    assert space.used == max((v[1] for v in model.values()), default=0)
    owner = np.full(space.capacity, -1)
    for tex, (start, stop, header) in model.items():
        owner[start + HEADER : stop] = tex
        lv, x, y = tiles_of(header)
        ids = space.ids(tex, lv, x, y)
        np.testing.assert_array_equal(ids - start - HEADER, space.pack_index(ids))
        np.testing.assert_array_equal(space.coords(ids)[1], lv)
    np.testing.assert_array_equal(space.is_tile(np.arange(space.capacity)), owner >= 0)
    np.testing.assert_array_equal(space.tex, owner)
