"""Feedback reduction: raw tile ids to unique wanted pages with coverage, invalid ids dropped, mip bias."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from texstream.pack.format import PackHeader
from texstream.runtime.compiled_loops import decider_loops
from texstream.runtime.feedback_reduce import (
    CompactFeedback,
    CompactionChoice,
    FeedbackReducer,
    Wanted,
    histogram_counts,
    unique_counts,
    unique_sums,
)
from texstream.runtime.tiles import HEADER, TileSpace

SMALL = PackHeader(width=1000, height=700, tile_size=64)  # levels 0..4: tiles 16x11, 8x6, 4x3, 2x2, 1x1
TINY = PackHeader(width=300, height=300, tile_size=64)  # levels 0..3: tiles 5x5, 3x3, 2x2, 1x1


def space_of(headers: dict[int, PackHeader]) -> TileSpace:
    space = TileSpace()
    for tex, header in headers.items():
        space.register(tex, header)
    return space


def tile_id(space: TileSpace, header: PackHeader, tex: int, level: int, x: int, y: int) -> int:
    """The documented layout: the texture's first tile id plus the tile's position in its pack index."""
    return space.ranges[tex].first_tile + header.tile_index(level, x, y)


def reference_ancestor(space: TileSpace, headers: dict[int, PackHeader], tile: int, levels: int) -> int:
    """Tile `levels` levels up, clamped at the coarsest level, from the pack geometry alone."""
    tex = next(t for t, r in space.ranges.items() if r.first_tile <= tile < r.stop)
    h = headers[tex]
    i = tile - space.ranges[tex].first_tile
    level = int(np.searchsorted(h.level_first, i, side="right")) - 1
    tx = h.tiles_in_level(level)[0]
    x, y = (i - int(h.level_first[level])) % tx, (i - int(h.level_first[level])) // tx
    up = min(levels, h.level_count - 1 - level)
    return tile_id(space, h, tex, level + up, x >> up, y >> up)


def pairs(wanted: Wanted) -> list[tuple[int, int]]:
    return list(zip(wanted.ids.tolist(), wanted.counts.tolist(), strict=True))


# ---- helpers --------------------------------------------------------------------------------------
def test_unique_counts_matches_a_counter() -> None:
    v = np.random.default_rng(0).integers(0, 50, 1000).astype(np.uint32).reshape(10, 100)
    u, c = unique_counts(v)
    assert list(zip(u.tolist(), c.tolist(), strict=True)) == sorted(Counter(v.ravel().tolist()).items())
    assert c.dtype == np.int64
    u, c = unique_counts(np.zeros(0, np.uint32))
    assert u.size == 0 and c.size == 0
    u, c = unique_counts(np.array([7, 7, 7]))
    assert u.tolist() == [7] and c.tolist() == [3]


@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
def test_histogram_counts_equal_the_sort_below_the_bound(dtype: type) -> None:
    """The histogram path gives what the sort gives for the values below its bound, and counts the rest
    (huge or negative values never size the histogram)."""
    rng = np.random.default_rng(5)
    v = rng.integers(0, 3000, 20000)
    v[rng.random(v.size) < 0.05] = 0xFFFFFFFF
    if dtype is np.int64:
        v[rng.random(v.size) < 0.05] = -(1 << 40)
    v = v.astype(dtype)
    u, c, outside = histogram_counts(v, 2500)
    su, sc = unique_counts(v)
    inside = (su >= 0) & (su < 2500)
    assert u.tolist() == su[inside].tolist() and c.tolist() == sc[inside].tolist()
    assert outside == int(sc[~inside].sum()) and outside > 0
    assert u.dtype == np.int64 and c.dtype == np.int64
    u, c, outside = histogram_counts(np.zeros(0, dtype), 10)
    assert u.size == c.size == outside == 0


def test_reduce_takes_the_same_pages_through_either_path() -> None:
    """Few entries over a large id space go through the sort, many through the histogram: the same answer."""
    headers = {0: PackHeader(width=8192, height=8192, tile_size=64), 1: TINY}
    space = space_of(headers)
    valid = np.concatenate([np.arange(r.first_tile, r.stop) for r in space.ranges.values()])
    rng = np.random.default_rng(6)
    base = rng.choice(valid, 40).astype(np.uint32)
    base[:3] = [space.ranges[0].start, 0xFFFFFFFF, space.capacity + 7]  # a header entry, junk, past the end
    r = FeedbackReducer(space)
    few = r.reduce(base)  # 40 entries, thousands of ids: the sort
    many = r.reduce(np.tile(base, space.used // base.size + 1))  # the histogram
    k = space.used // base.size + 1
    assert pairs(many.wanted) == [(i, c * k) for i, c in pairs(few.wanted)]
    assert few.invalid == 3 and many.invalid == 3 * k


def test_unique_sums_matches_a_dict() -> None:
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 40, 500)
    weights = rng.integers(0, 1000, 500)
    expect: dict[int, int] = {}
    for k, wt in zip(keys.tolist(), weights.tolist(), strict=True):
        expect[k] = expect.get(k, 0) + wt
    k, s = unique_sums(keys, weights)
    assert list(zip(k.tolist(), s.tolist(), strict=True)) == sorted(expect.items())
    assert k.dtype == np.int64 and s.dtype == np.int64
    k, s = unique_sums(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert k.size == 0 and s.size == 0


def test_wanted_container() -> None:
    w = Wanted(np.array([3, 8, 9], np.int64), np.array([2, 5, 1], np.int64))
    assert len(w) == 3 and w.coverage == 8
    s = w.select(np.array([True, False, True]))
    assert pairs(s) == [(3, 2), (9, 1)] and s.coverage == 3
    e = Wanted.empty()
    assert len(e) == 0 and e.coverage == 0 and e.ids.dtype == np.int64


# ---- reduce ---------------------------------------------------------------------------------------
def test_reduce_counts_unique_pages() -> None:
    headers = {0: SMALL, 3: TINY}
    space = space_of(headers)
    a = tile_id(space, SMALL, 0, 0, 5, 4)
    b = tile_id(space, SMALL, 0, 2, 1, 1)
    c = tile_id(space, TINY, 3, 1, 2, 2)
    d = tile_id(space, SMALL, 0, 4, 0, 0)
    raw = np.array([a] * 7 + [b] * 3 + [c] * 2 + [d], np.uint32)
    np.random.default_rng(2).shuffle(raw)
    res = FeedbackReducer(space).reduce(raw.reshape(-1, 1))  # any shape
    assert pairs(res.wanted) == sorted([(a, 7), (b, 3), (c, 2), (d, 1)])
    assert (res.samples, res.invalid, res.bias_levels) == (13, 0, 0)
    assert res.wanted.coverage == 13 and res.wanted.ids.dtype == np.int64 and res.wanted.counts.dtype == np.int64


def test_reduce_drops_and_counts_ids_that_name_no_tile() -> None:
    headers = {0: SMALL, 1: TINY, 2: SMALL}
    space = space_of(headers)
    good = tile_id(space, SMALL, 2, 1, 3, 3)
    first = space.ranges[0].first_tile
    space.unregister(1)  # closed while its draws were in flight
    closed = [space.ranges[0].stop + HEADER, space.ranges[0].stop + HEADER + 30]  # tiles of texture 1
    bad = (
        [space.ranges[0].start] * 3  # header entries of texture 0 (level-first ids for the shader)
        + [first - 1] * 2
        + [space.ranges[2].start + 5]  # a header entry of texture 2
        + closed * 2
        + [space.ranges[2].stop, space.capacity - 1, space.capacity, 1 << 30]  # past every range
        + [0xFFFFFFFF] * 6  # what an empty feedback entry could hold
    )
    raw = np.array(bad + [good] * 4 + [first] * 2, np.uint32)
    np.random.default_rng(3).shuffle(raw)
    res = FeedbackReducer(space).reduce(raw.reshape(2, -1))
    assert pairs(res.wanted) == [(first, 2), (good, 4)]
    assert (res.samples, res.invalid) == (raw.size, len(bad))
    # Negative entries (signed input) name no tile either.
    res = FeedbackReducer(space).reduce(np.array([-1, -(1 << 40), good], np.int64))
    assert pairs(res.wanted) == [(good, 1)] and res.invalid == 2


def test_reduce_of_nothing() -> None:
    space = space_of({0: SMALL})
    r = FeedbackReducer(space)
    for raw in (np.zeros(0, np.uint32), np.full((4, 4), 0xFFFFFFFF, np.uint32)):
        res = r.reduce(raw, bias=2.0)
        assert len(res.wanted) == 0 and res.samples == raw.size and res.invalid == raw.size
        assert res.wanted.ids.dtype == np.int64 and res.wanted.counts.dtype == np.int64


def test_reduce_rejects_bad_input() -> None:
    r = FeedbackReducer(space_of({0: SMALL}))
    with pytest.raises(TypeError, match="integer tile ids"):
        r.reduce(np.zeros(4, np.float32))
    for bias in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="mip bias"):
            r.reduce(np.zeros(4, np.uint32), bias=bias)


def test_reduce_applies_mip_bias_and_merges_counts() -> None:
    space = space_of({0: SMALL, 1: TINY})

    def t(tex: int, level: int, x: int, y: int) -> int:
        return tile_id(space, {0: SMALL, 1: TINY}[tex], tex, level, x, y)

    raw = np.array(
        [t(0, 0, 4, 4)] * 2  # -> (1, 2, 2)
        + [t(0, 0, 5, 5)] * 3  # -> (1, 2, 2)
        + [t(0, 1, 2, 2)]  # -> (2, 1, 1)
        + [t(0, 0, 8, 4)]  # -> (1, 4, 2)
        + [t(0, 4, 0, 0)] * 5  # the top level stays
        + [t(0, 3, 1, 1)]  # -> the top level
        + [t(1, 0, 4, 4)] * 4  # another texture: -> (1, 2, 2) of texture 1, not merged with texture 0's
        + [0xFFFFFFFF] * 2,
        np.uint32,
    )
    res = FeedbackReducer(space).reduce(raw, bias=1.75)  # floor: one level coarser
    assert res.bias_levels == 1 and res.invalid == 2 and res.samples == raw.size
    assert pairs(res.wanted) == sorted(
        [(t(0, 1, 2, 2), 5), (t(0, 2, 1, 1), 1), (t(0, 1, 4, 2), 1), (t(0, 4, 0, 0), 6), (t(1, 1, 2, 2), 4)]
    )
    res = FeedbackReducer(space).reduce(raw, bias=2.0)
    assert res.bias_levels == 2
    assert pairs(res.wanted) == sorted(
        [(t(0, 2, 1, 1), 5), (t(0, 3, 0, 0), 1), (t(0, 2, 2, 1), 1), (t(0, 4, 0, 0), 6), (t(1, 2, 1, 1), 4)]
    )
    res = FeedbackReducer(space).reduce(raw, bias=6.0)  # past every texture's top: clamped
    assert pairs(res.wanted) == [(t(0, 4, 0, 0), 13), (t(1, 3, 0, 0), 4)]
    res = FeedbackReducer(space).reduce(raw, bias=0.9)  # below one level: unchanged
    assert res.bias_levels == 0 and res.wanted.coverage == raw.size - 2 and len(res.wanted) == 7


def test_coarsen_merges_counts() -> None:
    space = space_of({0: SMALL})

    def t(level: int, x: int, y: int) -> int:
        return tile_id(space, SMALL, 0, level, x, y)

    r = FeedbackReducer(space)
    w = r.reduce(np.array([t(0, 0, 0)] * 3 + [t(0, 1, 1)] + [t(0, 4, 0)] * 2 + [t(2, 3, 2)], np.uint32)).wanted
    assert r.coarsen(w, 0) is w and r.coarsen(w, -1) is w
    assert r.coarsen(Wanted.empty(), 3).ids.size == 0
    assert pairs(r.coarsen(w, 1)) == sorted([(t(1, 0, 0), 4), (t(1, 2, 0), 2), (t(3, 1, 1), 1)])
    assert pairs(r.coarsen(w, 2)) == sorted([(t(2, 0, 0), 4), (t(2, 1, 0), 2), (t(4, 0, 0), 1)])
    assert pairs(r.coarsen(w, 9)) == [(t(4, 0, 0), 7)]
    # Coarsening twice is coarsening once by the sum.
    assert pairs(r.coarsen(r.coarsen(w, 1), 2)) == pairs(r.coarsen(w, 3))


def test_reused_range_belongs_to_the_new_texture() -> None:
    space = space_of({0: SMALL, 1: TINY})
    r = FeedbackReducer(space)
    old = np.arange(space.ranges[0].first_tile, space.ranges[0].stop, dtype=np.uint32)
    assert len(r.reduce(old).wanted) == SMALL.tile_count
    space.unregister(0)
    res = r.reduce(old)
    assert len(res.wanted) == 0 and res.invalid == old.size
    space.register(2, TINY)  # first fit: texture 2 takes the start of texture 0's old range
    res = r.reduce(old)
    assert len(res.wanted) == TINY.tile_count and res.invalid == old.size - TINY.tile_count
    assert res.wanted.ids[0] == space.ranges[2].first_tile


@pytest.mark.parametrize("bias", [0.0, 1.5, 3.0])
def test_reduce_large_buffer_matches_a_counter(bias: float) -> None:
    """A feedback target's worth of random entries, valid and not, reduces exactly as a plain-Python count."""
    rng = np.random.default_rng(4)
    headers = {
        0: PackHeader(width=8192, height=8192, tile_size=64),
        1: PackHeader(width=5000, height=3000, tile_size=128),
        2: SMALL,
        3: PackHeader(width=8192, height=2048, tile_size=256),
        4: TINY,
    }
    space = space_of(headers)
    space.unregister(2)  # a hole of closed ids between open ranges
    del headers[2]
    valid = np.concatenate([np.arange(r.first_tile, r.stop) for r in space.ranges.values()])
    n = 240 * 135
    raw = rng.choice(valid, n).astype(np.uint32)
    junk = rng.random(n) < 0.1
    raw[junk] = rng.integers(0, space.capacity + 1000, int(junk.sum()))  # headers, the hole, past the end
    raw[rng.random(n) < 0.01] = 0xFFFFFFFF
    raw = raw.reshape(135, 240)

    res = FeedbackReducer(space).reduce(raw, bias=bias)

    tiles = set(valid.tolist())
    expect: Counter[int] = Counter()
    invalid = 0
    for value, count in Counter(raw.ravel().tolist()).items():
        if value in tiles:
            expect[reference_ancestor(space, headers, value, int(bias))] += count
        else:
            invalid += count
    assert invalid > 0
    assert pairs(res.wanted) == sorted(expect.items())
    assert (res.samples, res.invalid, res.bias_levels) == (n, invalid, int(bias))


@pytest.mark.parametrize("bias", [0.0, 2.0])
def test_one_compacted_buffer_reduces_as_its_entries_do(bias: float) -> None:
    """A buffer compacted on the GPU (unique ids in any order, with counts; closed ids among them)
    gives the pages and counts its raw entries give; ids listed twice against the shader's promise
    are summed, not listed twice."""
    rng = np.random.default_rng(9)
    space = space_of({0: SMALL, 1: TINY, 2: SMALL})
    space.unregister(1)
    raw = rng.integers(0, space.used, 5000).astype(np.uint32)
    ids, counts = np.unique(raw, return_counts=True)
    order = rng.permutation(ids.size)
    ids, counts = ids[order], counts[order].astype(np.uint32)
    half = counts // 2
    reducer = FeedbackReducer(space)
    want = reducer.reduce(raw, bias=bias)
    for compact in (
        CompactFeedback(ids, counts, raw.size, 0),
        CompactFeedback(np.concatenate([ids, ids]), np.concatenate([half, counts - half]), raw.size, 0),
    ):
        got = reducer.reduce_batches([compact], bias=bias)
        assert got.wanted.ids.tolist() == want.wanted.ids.tolist()
        assert got.wanted.counts.tolist() == want.wanted.counts.tolist()
        assert got.invalid == want.invalid


def _run_choice(choice: CompactionChoice, cost: dict[bool, float], frames: int) -> list[bool]:
    """`frames` frames of feedback costing `cost[way]`; the way each frame's buffer was made."""
    ways = []
    for _ in range(frames):
        ways.append(choice.compact)
        choice.record(choice.compact, cost[choice.compact])
    return ways


def test_compaction_is_kept_only_while_it_costs_the_render_thread_less() -> None:
    choice = CompactionChoice(True, probe_frames=4, reprobe_frames=20)
    ways = _run_choice(choice, {True: 3e-4, False: 1e-4}, 8)
    assert ways == [True] * 4 + [False] * 4  # compaction measured first, then the CPU reduction
    assert choice.chosen is False and not choice.compact
    ways = _run_choice(choice, {True: 3e-4, False: 1e-4}, 28)
    assert ways == [False] * 20 + [True] * 4 + [False] * 4  # measured again after reprobe_frames
    ways = _run_choice(choice, {True: 1e-4, False: 3e-4}, 20)  # the screen grew: now compaction pays
    assert ways == [False] * 16 + [True] * 4 and choice.chosen is True and choice.compact  # 20 since the choice


def test_frames_read_from_buffers_of_the_other_way_are_not_counted() -> None:
    choice = CompactionChoice(True, probe_frames=2)
    choice.record(False, 1.0)  # a buffer closed before compaction was chosen: not compaction's cost
    choice.record(True, 1e-4)
    choice.record(True, 1e-4)
    assert not choice.compact and choice.median(True) == pytest.approx(1e-4) and choice.median(False) is None


def test_without_compaction_the_choice_never_compacts() -> None:
    choice = CompactionChoice(False, probe_frames=1)
    assert _run_choice(choice, {True: 0.0, False: 1.0}, 5) == [False] * 5 and choice.chosen is None
    with pytest.raises(ValueError, match="probe_frames"):
        CompactionChoice(True, probe_frames=0)


@pytest.mark.skipif(decider_loops() is None, reason="the compiled helper is not built")
@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_count_of_raw_entries_equals_numpys(seed: int) -> None:
    """Raw uint32 feedback (repeats, ids of no tile, ids past every texture, a gap where a texture
    closed) reduces to the same pages, counts and dropped entries through both paths, frame after
    frame (the compiled count leaves its scratch clean), and under a bias."""
    rng = np.random.default_rng(seed)
    space = space_of({0: SMALL, 1: PackHeader(width=512, height=512, tile_size=128), 2: SMALL})
    space.unregister(1)
    loops = decider_loops()
    assert loops is not None
    compiled, plain = FeedbackReducer(space, feedback_loop=loops.feedback_pages), FeedbackReducer(space)
    for frame in range(3):
        raw = rng.integers(0, space.used + 50, int(rng.integers(1, 5000))).astype(np.uint32)
        raw[:: 97 + frame] = np.uint32(0xFFFFFFFF)
        for bias in (0.0, 1.5):
            a, b = compiled.reduce(raw, bias), plain.reduce(raw, bias)
            np.testing.assert_array_equal(a.wanted.ids, b.wanted.ids)
            np.testing.assert_array_equal(a.wanted.counts, b.wanted.counts)
            assert (a.samples, a.invalid, a.bias_levels) == (b.samples, b.invalid, b.bias_levels)
    empty = compiled.reduce(np.full(7, 0xFFFFFFFF, np.uint32))
    assert len(empty.wanted) == 0 and empty.invalid == 7
