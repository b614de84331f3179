"""Texture sets and priorities on the CPU: the lead's wanted pages mapped onto members of other sizes
and tile sizes, a set streaming from its lead's feedback alone, a failing member keeping its fallback,
priority in request order, in the mip bias and in eviction, and a high-priority texture ending at
finer levels than an equal low-priority one at 2x oversubscription."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.pack.format import PackHeader
from texstream.runtime.compiled_loops import decider_loops
from texstream.runtime.feedback_reduce import CompactFeedback, FeedbackReducer, Wanted
from texstream.runtime.slots import SlotLedger
from texstream.runtime.texture_sets import (
    MAX_PRIORITY,
    Priorities,
    SetTable,
    bias_levels,
    check_priority,
    choose_lead,
    coarsen_by,
)
from texstream.runtime.tiles import MAX_TEXTURES, TileSpace

from .test_residency import HEADER, Sim

BIG = PackHeader(width=1024, height=1024, tile_size=128)  # 8x8, 4x4, 2x2, 1x1
HALF = PackHeader(width=512, height=512, tile_size=128)  # 4x4, 2x2, 1x1
FINE_TILES = PackHeader(width=1024, height=1024, tile_size=64)  # 16x16 .. 1x1 (5 levels)
WIDE = PackHeader(width=1024, height=512, tile_size=128)  # 8x4, 4x2, 2x1, 1x1


def table(*headers: PackHeader) -> tuple[TileSpace, SetTable]:
    space = TileSpace()
    for t, h in enumerate(headers):
        space.register(t, h)
    sets = SetTable(space)
    sets.add(0, list(range(len(headers))), dict(enumerate(headers)))
    return space, sets


def pages(space: TileSpace, tex: int, coords: list[tuple[int, int, int]]) -> np.ndarray:
    lv, x, y = (np.array(c) for c in zip(*coords, strict=True))
    return space.ids(tex, lv, x, y)


def wanted(ids: np.ndarray, counts: list[int] | None = None) -> Wanted:
    order = np.argsort(ids)
    c = np.ones(ids.size, np.int64) if counts is None else np.array(counts, np.int64)
    return Wanted(ids[order].astype(np.int64), c[order])


def as_dict(space: TileSpace, w: Wanted, tex: int) -> dict[tuple[int, int, int], int]:
    t, lv, x, y = space.coords(w.ids)
    m = t == tex
    return {(int(a), int(b), int(c)): int(n) for a, b, c, n in zip(lv[m], x[m], y[m], w.counts[m], strict=True)}


def test_a_member_of_equal_size_wants_the_lead_pages_and_their_coverage() -> None:
    space, sets = table(BIG, BIG)
    lead = pages(space, 0, [(0, 5, 3), (1, 2, 2), (3, 0, 0)])
    out = sets.expand(wanted(lead, [7, 2, 1]))
    assert as_dict(space, out, 0) == {(0, 5, 3): 7, (1, 2, 2): 2, (3, 0, 0): 1}
    assert as_dict(space, out, 1) == as_dict(space, out, 0)
    assert np.all(np.diff(out.ids) > 0)  # one sorted, unique Wanted


def test_a_smaller_member_wants_one_level_finer_of_its_own_clamped_at_its_levels() -> None:
    """A 512^2 member beside a 1024^2 lead: level l - 1 of its own, the page under the same uv."""
    space, sets = table(BIG, HALF)
    lead = pages(space, 0, [(0, 5, 3), (0, 4, 3), (1, 3, 2), (3, 0, 0)])
    got = as_dict(space, sets.expand(wanted(lead, [1, 2, 4, 8])), 1)
    # level 0 is clamped: both level-0 lead pages lie on member page (0, 2, 1); counts add up
    assert got == {(0, 2, 1): 3, (0, 3, 2): 4, (2, 0, 0): 8}


def test_a_member_with_smaller_tiles_wants_every_page_under_the_lead_page() -> None:
    space, sets = table(BIG, FINE_TILES)
    got = as_dict(space, sets.expand(wanted(pages(space, 0, [(0, 1, 1), (3, 0, 0)]))), 1)
    assert set(got) == {(0, x, y) for x in (2, 3) for y in (2, 3)} | {(3, x, y) for x in (0, 1) for y in (0, 1)}


def test_a_member_of_another_aspect_maps_per_axis() -> None:
    space, sets = table(BIG, WIDE)
    got = as_dict(space, sets.expand(wanted(pages(space, 0, [(0, 7, 7), (1, 0, 0)]))), 1)
    # same level (same largest side); rows scale by 512/1024
    assert got == {(0, 7, 3): 1, (1, 0, 0): 1}


def test_textures_outside_sets_and_sets_without_wanted_lead_pages_are_left_alone() -> None:
    space = TileSpace()
    for t, h in enumerate((BIG, BIG, BIG)):
        space.register(t, h)
    sets = SetTable(space)
    sets.add(1, [1, 2], {1: BIG, 2: BIG})
    w = wanted(pages(space, 0, [(0, 1, 1), (0, 2, 2)]))
    assert sets.expand(w) is w
    sets.forget_texture(2)
    assert sets.pair_count == 0


@pytest.mark.skipif(decider_loops() is None, reason="the compiled helper is not built")
@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_feedback_expansion_equals_numpys_for_any_sets_and_pages(seed: int) -> None:
    """Random sets over members of every shape the table maps (equal, half, finer tiles, another aspect),
    a texture in two sets, random feedback of leads and others (raw entries with repeats and ids of no
    tile, and the same compacted with counts): the compiled reduction, which expands the sets in the same
    call and counts each pool's pages, gives numpy's pages and coverage, frame after frame (its scratch
    is left clean), and refuses a follower table that names a page past the id space."""
    rng = np.random.default_rng(seed)
    shapes = (BIG, HALF, FINE_TILES, WIDE)
    headers = [shapes[int(i)] for i in rng.integers(0, len(shapes), 7)]
    space = TileSpace()
    for t, h in enumerate(headers):
        space.register(t, h)
    loops = decider_loops()
    assert loops is not None
    compiled, plain = FeedbackReducer(space, feedback_loop=loops.feedback_pages), FeedbackReducer(space)
    sets = SetTable(space)
    for members in ([0, 1, 2], [3, 4], [5, 1, 6]):
        sets.add(members[0], members, {t: headers[t] for t in members})
    pool_of = np.full(MAX_TEXTURES, -1, np.int64)
    pool_of[: len(headers)] = rng.integers(0, 3, len(headers))
    for _ in range(2):  # twice: the first call must not leave coverage behind in the scratch
        raw = rng.integers(0, space.used + 40, int(rng.integers(1, 3000))).astype(np.uint32)
        ids, counts = np.unique(raw, return_counts=True)
        for batch in (raw, CompactFeedback(ids, counts.astype(np.uint32), int(raw.size), 0)):
            a = compiled.wanted_pages([batch], sets.follow, sets.expand, pool_of, 4)
            b = plain.wanted_pages([batch], sets.follow, sets.expand, pool_of, 4)
            np.testing.assert_array_equal(a.ids, b.ids)
            np.testing.assert_array_equal(a.counts, b.counts)
            assert b.pool_pages is None and a.pool_pages is not None
            per_pool = pool_of[space.tex[b.ids].astype(np.int64)]
            np.testing.assert_array_equal(a.pool_pages, np.bincount(per_pool[per_pool >= 0], minlength=4))
    bad = sets.follow.copy()
    bad[space.ranges[0].first_tile, 0] = space.capacity + 5
    lead_page = np.array([space.ranges[0].first_tile], np.uint32)
    with pytest.raises(ValueError, match="outside"):
        compiled.wanted_pages([lead_page], bad, sets.expand, pool_of, 4)


def test_the_lead_is_the_member_with_the_finest_texels() -> None:
    assert choose_lead([HALF, WIDE, BIG, BIG]) == 2
    with pytest.raises(ValueError, match="at least one member"):
        choose_lead([])


def set_sim(capacity: int = 300, **cfg: object) -> Sim:
    sim = Sim(capacity=capacity, textures=3, **cfg)
    sim.core.sets.add(0, [0, 1, 2], dict.fromkeys(range(3), HEADER))
    return sim


def test_a_set_streams_every_member_from_its_leads_feedback_alone() -> None:
    sim = set_sim()
    want = sim.level_pages(0, 0)  # only the lead's pages come back from the GPU
    for _ in range(8):
        sim.frame(want)
    tables = sim.core.tables
    for tex in range(3):
        assert tables.is_resident(sim.level_pages(tex, 0)).all(), tex
    assert sim.core.completeness().per_texture == {0: 1.0, 1: 1.0, 2: 1.0}


def test_a_member_whose_tiles_fail_keeps_its_fallback_while_the_others_stream() -> None:
    sim = set_sim(retry_frames=2)
    sim.fail = {int(t) for level in (0, 1) for t in sim.level_pages(1, level)}  # member 1: every streamed tile
    for _ in range(10):
        sim.frame(sim.level_pages(0, 0))
    tables = sim.core.tables
    assert tables.is_resident(sim.level_pages(0, 0)).all() and tables.is_resident(sim.level_pages(2, 0)).all()
    assert not tables.is_resident(sim.level_pages(1, 0)).any()
    assert (tables.resident_level(sim.level_pages(1, 0)) == 2).all()  # its pinned level stands in
    assert sim.core.corrupt_tiles(1) == 80 and sim.core.corrupt_tiles(0) == 0


# ---- priority ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), MAX_PRIORITY * 2])
def test_priorities_out_of_range_are_refused_by_value(bad: float) -> None:
    with pytest.raises(ValueError, match="priority must be a finite number"):
        check_priority(bad)


@pytest.mark.parametrize("bad", ["2", None, True])
def test_priorities_that_are_not_numbers_are_refused_by_type(bad: object) -> None:
    with pytest.raises(TypeError, match="priority must be a number"):
        check_priority(bad)


def test_priority_weighs_the_share_of_the_mip_bias_each_texture_takes() -> None:
    space = TileSpace()
    for t in range(3):
        space.register(t, BIG)
    prio = Priorities()
    prio.set(0, 4.0)
    prio.set(2, 0.5)
    ids = np.array([space.ranges[t].first_tile for t in range(3)])
    # the highest wanted priority keeps the plain bias; 4x lower: two levels more; 8x lower: three
    assert bias_levels(space, prio.values, ids, 0.25).tolist() == [0, 2, 3]
    assert bias_levels(space, prio.values, ids, 1.0).tolist() == [1, 3, 4]
    # without the high-priority texture in view the bias is relative to the highest one left
    assert bias_levels(space, prio.values, ids[1:], 1.0).tolist() == [1, 2]
    w = coarsen_by(space, wanted(ids), np.array([0, 2, 3]))
    assert space.level[w.ids].tolist() == [0, 2, 3]


def test_requests_of_a_higher_priority_texture_go_first() -> None:
    sim = Sim(capacity=200, textures=2, request_tiles_per_frame=8)
    sim.core.priority.set(1, 3.0)
    want = np.concatenate([sim.level_pages(0, 1), sim.level_pages(1, 1)])  # same coverage on both
    orders = sim.frame(want)["orders"]
    assert len(orders) == 8 and (sim.core.space.tex[orders.tiles] == 1).all()


def ledger_with_two_idle_tiles(priority: np.ndarray) -> SlotLedger:
    ledger = SlotLedger("pool/test", 3, frames_in_flight=2)
    ledger.weigh_by(priority)
    a = ledger.allocate(0, np.array([100, 200, 300]), np.array([0, 1, 1]), np.zeros(3))
    ledger.mark_resident(a.slots, 0)
    ledger.touch(a.slots[:1], 6)  # texture 0's tile idle 4 frames at frame 10, texture 1's idle 10
    ledger.touch(a.slots[2:], 9)  # texture 1's second tile: used by a frame that may be in flight
    return ledger


def test_eviction_takes_the_longest_idle_tile_weighted_by_priority() -> None:
    prio = np.ones(256)
    assert ledger_with_two_idle_tiles(prio).allocate(
        10, np.array([7]), np.array([0]), np.zeros(1)
    ).evicted_tiles.tolist() == [200]
    prio[1] = 4.0  # idle 10 at priority 4 counts as 2.5: texture 0's tile (idle 4) goes first
    ledger = ledger_with_two_idle_tiles(prio)
    assert ledger.allocate(10, np.array([7]), np.array([0]), np.zeros(1)).evicted_tiles.tolist() == [100]
    # then the other idle one; never the tile a frame in flight may sample, however low its priority
    prio[1] = 1e-3
    got = ledger.allocate(10, np.array([8, 9]), np.array([0, 0]), np.zeros(2))
    assert got.evicted_tiles.tolist() == [200] and got.slots.tolist() == [1, -1]


def mean_level(sim: Sim, tex: int) -> float:
    """Mean level the texture's level-0 pages are drawn from."""
    return float(sim.core.tables.resident_level(sim.level_pages(tex, 0)).mean())


def aimed_level(sim: Sim, tex: int) -> float:
    """Mean level of the pages streaming aims at for the texture (the wanted pages, bias applied)."""
    ids = sim.core.wanted.ids
    return float(sim.core.space.level[ids[sim.core.space.tex[ids] == tex]].mean())


@pytest.mark.parametrize("high", [1.0, 2.0, 4.0])
def test_at_2x_oversubscription_the_high_priority_texture_ends_at_finer_levels(high: float) -> None:
    """Two equal textures wanting every level-0 page each (160 tiles with parents) in 80 streaming
    slots: the mip bias must coarsen; priority decides who gives way. The high-priority texture is
    the second one, so ties (broken by tile id) cannot favour it."""
    sim = Sim(capacity=90, textures=2)  # 10 pinned
    sim.core.priority.set(1, high)
    want = np.concatenate([sim.level_pages(0, 0), sim.level_pages(1, 0)])
    for _ in range(80):
        sim.frame(want)
    assert sim.core.budget.bias > 0 and sim.core.completeness().complete
    lo, hi = aimed_level(sim, 0), aimed_level(sim, 1)
    if high == 1.0:
        assert hi == lo == 1.0  # seen the same way, equal priorities: the same levels
    else:
        assert hi < lo, (hi, lo)
        assert mean_level(sim, 1) < mean_level(sim, 0)  # and what is drawn
