"""RequestScheduler: dedup, parents first, priority, cancel, prefetch, caps, retry back-off."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.config import StreamerConfig
from texstream.pack.format import PackHeader
from texstream.runtime.feedback_reduce import WantedPages
from texstream.runtime.page_table import PageTable
from texstream.runtime.requests import RequestScheduler
from texstream.runtime.tile_cache import SlotGeometry, SlotPool, TileState, split_tile_keys, tile_keys

HEADER = PackHeader(width=1000, height=700, tile_size=64)  # pages 16x11, 8x6, 4x3, 2x2, 1x1
TILE = HEADER.tile_raw_size


def table(resident_levels: tuple[int, ...] = (4,), extra: tuple[tuple[int, int, int], ...] = ()) -> PageTable:
    """Page table with whole levels resident plus single tiles."""
    t = PageTable(HEADER, pinned_levels=1)
    slot = 0
    for lv in sorted(resident_levels, reverse=True):
        tx, ty = HEADER.tiles_in_level(lv)
        for y in range(ty):
            for x in range(tx):
                t.set_resident(lv, x, y, slot)
                slot += 1
    for lv, x, y in extra:
        t.set_resident(lv, x, y, slot)
        slot += 1
    return t


def sched(**kw) -> RequestScheduler:
    cfg_keys = {"prefetch", "cancel_after_frames", "retry_frames", "ring_mb"}
    cfg = StreamerConfig(**({"prefetch": False} | {k: v for k, v in kw.items() if k in cfg_keys}))
    return RequestScheduler(cfg, **{k: v for k, v in kw.items() if k not in cfg_keys})


def want(*tiles: tuple[int, int, int, int, int]) -> WantedPages:
    return WantedPages.from_tiles(list(tiles))


def key(tex: int, level: int, x: int, y: int) -> int:
    return int(tile_keys(tex, level, x, y))


def test_resident_and_duplicate_pages_are_not_requested() -> None:
    s = sched()
    t = table(extra=((3, 0, 0), (2, 1, 1), (1, 2, 2), (0, 5, 4)))
    assert len(s.update(0, want((0, 0, 5, 4, 9)), {0: t})) == 0
    b = s.update(1, want((0, 0, 4, 4, 2), (0, 0, 4, 4, 3)), {0: t})  # duplicate entries merge
    assert b.tuples() == [(0, 0, 4, 4)] and b.nbytes.tolist() == [TILE] and not b.prefetch.any()


def test_in_flight_tiles_are_not_reissued() -> None:
    s = sched()
    t = table(extra=((3, 0, 0), (2, 1, 1), (1, 2, 2)))
    assert s.update(0, want((0, 0, 5, 4, 1)), {0: t}).tuples() == [(0, 0, 5, 4)]
    assert s.state_of(np.array([key(0, 0, 5, 4)])).tolist() == [TileState.LOADING]
    assert s.in_flight_count == 1 and s.in_flight_bytes == TILE
    assert len(s.update(1, want((0, 0, 5, 4, 1)), {0: t})) == 0
    t.set_resident(0, 5, 4, 99)  # arrived; the scheduler notices even without mark_resident
    assert len(s.update(2, want((0, 0, 5, 4, 1)), {0: t})) == 0 and s.in_flight_count == 0


def test_missing_chain_is_requested_parents_first() -> None:
    s = sched()
    b = s.update(0, want((0, 0, 5, 4, 1)), {0: table()})
    assert b.tuples() == [(0, 3, 0, 0), (0, 2, 1, 1), (0, 1, 2, 2), (0, 0, 5, 4)]


def test_nothing_resident_requests_from_the_coarsest_level() -> None:
    b = sched().update(0, want((0, 1, 3, 3, 1)), {0: table(resident_levels=())})
    assert b.tuples() == [(0, 4, 0, 0), (0, 3, 0, 0), (0, 2, 1, 1), (0, 1, 3, 3)]


def test_capped_chain_descends_one_tile_per_frame() -> None:
    s = sched(max_tiles=1)
    t = table()
    w = want((0, 0, 5, 4, 1))
    got = [s.update(f, w, {0: t}).tuples() for f in range(5)]
    assert got == [[(0, 3, 0, 0)], [(0, 2, 1, 1)], [(0, 1, 2, 2)], [(0, 0, 5, 4)], []]


def test_child_waits_while_its_parent_is_missing() -> None:
    s = sched(max_tiles=1)
    t = table(extra=((3, 0, 0), (2, 1, 1)))
    assert s.update(0, want((0, 0, 5, 4, 1)), {0: t}).tuples() == [(0, 1, 2, 2)]
    s.mark_dropped(np.array([key(0, 1, 2, 2)]))  # parent abandoned; the child is still queued
    b = s.update(1, WantedPages.empty(), {0: t})
    assert len(b) == 0 and b.deferred == 1 and s.queued_count == 1
    # Wanted again: the chain expands again and the parent goes first.
    assert s.update(2, want((0, 0, 5, 4, 1)), {0: t}).tuples() == [(0, 1, 2, 2)]


def test_priority_by_coverage() -> None:
    s = sched()
    t = table(resident_levels=(4, 3, 2, 1))
    b = s.update(0, want((0, 0, 0, 0, 5), (0, 0, 2, 2, 50), (0, 0, 4, 4, 20)), {0: t})
    assert b.tuples() == [(0, 0, 2, 2), (0, 0, 4, 4), (0, 0, 0, 0)]


def test_priority_by_level_gap() -> None:
    s = sched()
    t = table(resident_levels=(4, 3), extra=((2, 0, 0), (1, 0, 0)))
    # Same coverage; A has its parent resident (gap 1), B is 3 levels from its resident ancestor.
    b = s.update(0, want((0, 0, 0, 0, 10), (0, 0, 9, 9, 10)), {0: t})
    assert b.tuples() == [(0, 2, 2, 2), (0, 1, 4, 4), (0, 0, 9, 9), (0, 0, 0, 0)]


def test_shared_parent_accumulates_the_coverage_of_its_children() -> None:
    s = sched()
    t = table(resident_levels=(4, 3, 2))
    # (0, 8, 8) and (0, 9, 9) share the missing parent (1, 4, 4); (0, 2, 2) is alone under (1, 1, 1).
    b = s.update(0, want((0, 0, 8, 8, 4), (0, 0, 9, 9, 4), (0, 0, 2, 2, 6)), {0: t})
    assert b.tuples()[0] == (0, 1, 4, 4)  # weight 16 beats (1, 1, 1)'s 12
    order = b.tuples()
    for i, (tex, lv, x, y) in enumerate(order):
        if lv < 1:
            assert order.index((tex, lv + 1, x >> 1, y >> 1)) < i


def test_stale_requests_are_cancelled() -> None:
    s = sched(cancel_after_frames=4, max_in_flight_bytes=TILE)
    t = table(resident_levels=(4, 3, 2, 1))
    w = want((0, 0, 0, 0, 9), (0, 0, 2, 2, 5), (0, 0, 4, 4, 1))
    assert s.update(0, w, {0: t}).tuples() == [(0, 0, 0, 0)]  # the rest waits for in-flight room
    for f in (1, 2):
        b = s.update(f, WantedPages.empty(), {0: t})
        assert len(b) == 0 and b.capped == 2 and len(b.cancelled) == 0
    s.update(3, want((0, 0, 4, 4, 1)), {0: t})  # wanted again: its clock restarts
    b = s.update(4, WantedPages.empty(), {0: t})
    assert b.cancelled.tolist() == [key(0, 0, 2, 2)] and s.queued_count == 1
    assert s.update(7, WantedPages.empty(), {0: t}).cancelled.tolist() == [key(0, 0, 4, 4)]
    assert s.stats.cancelled == 2 and s.queued_count == 0 and s.in_flight_count == 1


def test_prefetch_neighbours_and_children_after_demand() -> None:
    s = sched(prefetch=True)
    t = table(resident_levels=(4, 3, 2), extra=((1, 2, 2),))
    b = s.update(0, want((0, 1, 2, 2, 10), (0, 0, 0, 0, 1)), {0: t})
    tiles = b.tuples()
    demand = [tl for tl, p in zip(tiles, b.prefetch.tolist(), strict=True) if not p]
    prefetch = {tl for tl, p in zip(tiles, b.prefetch.tolist(), strict=True) if p}
    assert demand == [(0, 1, 0, 0), (0, 0, 0, 0)] and tiles[:2] == demand  # demand first
    assert prefetch == {
        (0, 1, 1, 2), (0, 1, 3, 2), (0, 1, 2, 1), (0, 1, 2, 3),  # neighbours of (1, 2, 2)
        (0, 0, 4, 4), (0, 0, 5, 4), (0, 0, 4, 5), (0, 0, 5, 5),  # its children
    }  # fmt: skip
    # Nothing prefetched whose parent is missing: e.g. (0, 1, 0) under the non-resident (1, 0, 0).
    assert (0, 0, 1, 0) not in prefetch and (0, 0, 0, 1) not in prefetch
    assert s.stats.issued_prefetch == 8


def test_no_prefetch_when_disabled() -> None:
    s = sched(prefetch=False)
    t = table(resident_levels=(4, 3, 2), extra=((1, 2, 2),))
    assert len(s.update(0, want((0, 1, 2, 2, 10)), {0: t})) == 0


def test_prefetch_stays_inside_the_grid() -> None:
    s = sched(prefetch=True)
    t = table(resident_levels=(4, 3, 2, 1), extra=((0, 15, 10),))
    b = s.update(0, want((0, 0, 15, 10, 3)), {0: t})
    assert set(b.tuples()) == {(0, 0, 14, 10), (0, 0, 15, 9)} and b.prefetch.all()


def test_caps_in_tiles_and_bytes() -> None:
    t = table(resident_levels=(4, 3, 2, 1))
    w = want(*[(0, 0, x, 0, 100 - x) for x in range(10)])
    b = sched(max_tiles=3).update(0, w, {0: t})
    assert b.tuples() == [(0, 0, x, 0) for x in range(3)] and b.capped == 7
    b = sched(max_bytes=int(TILE * 4.5)).update(0, w, {0: t})
    assert len(b) == 4 and b.total_bytes == 4 * TILE
    s = sched(max_in_flight_bytes=5 * TILE)
    assert len(s.update(0, w, {0: t})) == 5
    assert len(s.update(1, w, {0: t})) == 0
    for x in (0, 1):
        t.set_resident(0, x, 0, 100 + x)
    s.mark_resident(np.array([key(0, 0, 0, 0), key(0, 0, 1, 0)]))
    assert s.update(2, w, {0: t}).tuples() == [(0, 0, 5, 0), (0, 0, 6, 0)]


def test_failed_tiles_retry_with_doubling_back_off() -> None:
    s = sched(retry_frames=10)
    t = table(resident_levels=(4, 3, 2, 1))
    w = want((0, 0, 3, 3, 1))
    k = np.array([key(0, 0, 3, 3)])
    assert len(s.update(0, w, {0: t})) == 1
    s.mark_failed(k, frame=0)
    assert s.state_of(k).tolist() == [TileState.FAILED]
    issued = [f for f in range(1, 100) if len(s.update(f, w, {0: t})) and (s.mark_failed(k, f) or True)]
    assert issued[:3] == [10, 30, 70]  # back-off 10, 20, 40 frames
    s2 = sched(retry_frames=10)
    s2.mark_failed(k, 0)
    assert [f for f in range(15) if len(s2.update(f, w, {0: t}))] == [10]
    s2.mark_resident(k)  # success clears the history
    assert s2.failed_count == 0 and s2.state_of(k).tolist() == [TileState.ABSENT]


def test_failed_parent_does_not_block_its_children() -> None:
    s = sched()
    t = table(resident_levels=(4, 3, 2))
    s.mark_failed(np.array([key(0, 1, 0, 0)]), frame=0)
    b = s.update(1, want((0, 0, 1, 1, 1)), {0: t})
    assert b.tuples() == [(0, 0, 1, 1)]


def test_invalid_pages_are_dropped_and_counted() -> None:
    s = sched()
    b = s.update(0, want((5, 0, 0, 0, 1), (0, 0, 16, 0, 1), (0, 9, 0, 0, 1), (0, 1, 0, 0, 1)),
                 {0: table(resident_levels=(4, 3, 2))})  # fmt: skip
    assert b.tuples() == [(0, 1, 0, 0)] and s.stats.invalid_pages == 3


def test_frames_must_not_go_back() -> None:
    s = sched()
    s.update(5, WantedPages.empty(), {})
    with pytest.raises(ValueError, match="frame 4"):
        s.update(4, WantedPages.empty(), {})
    with pytest.raises(ValueError, match="max_tiles"):
        sched(max_tiles=0)


def test_mark_loading_and_forget_texture() -> None:
    s = sched()
    t = table(resident_levels=())
    s.mark_loading(np.array([key(0, 4, 0, 0)]), TILE)  # the streamer loads the pinned level itself
    b = s.update(0, want((0, 3, 0, 0, 1)), {0: t, 1: t})
    assert b.tuples() == [(0, 3, 0, 0)]
    s.update(1, want((1, 3, 0, 0, 1)), {0: t, 1: t})
    s.forget_texture(0)
    tex = split_tile_keys(s._keys)[0]
    assert set(tex.tolist()) == {1}
    assert len(s.update(2, want((0, 3, 0, 0, 1)), {1: t})) == 0  # texture 0 gone: invalid


def test_multiple_textures_share_the_caps() -> None:
    big = PackHeader(width=4096, height=4096, tile_size=128)
    t0 = table(resident_levels=(4, 3, 2, 1))
    t1 = PageTable(big, pinned_levels=1)
    t1.set_resident(big.level_count - 1, 0, 0, 0)
    s = sched(max_bytes=TILE * 2 + big.tile_raw_size)
    b = s.update(
        0, want((0, 0, 0, 0, 50), (1, big.level_count - 2, 1, 1, 40), (0, 0, 1, 0, 30)), {0: t0, 1: t1}
    )
    assert b.tuples() == [(0, 0, 0, 0), (1, big.level_count - 2, 1, 1), (0, 0, 1, 0)]
    assert b.nbytes.tolist() == [TILE, big.tile_raw_size, TILE]


def test_simulated_streaming_keeps_invariants() -> None:
    """Scheduler + pool + page table with random wants, latencies and failures."""
    rng = np.random.default_rng(42)
    cfg = StreamerConfig(prefetch=True, cancel_after_frames=4, retry_frames=5)
    s = RequestScheduler(cfg, max_tiles=6, max_in_flight_bytes=12 * TILE)
    t = PageTable(HEADER, pinned_levels=2)
    pool = SlotPool("pool/bc1", 48, SlotGeometry(slot_size=72, slot_bytes=TILE), frames_in_flight=2)
    lv, xs, ys = t.pinned_tiles()
    slots = pool.allocate_many(0, np.zeros(lv.size), lv, xs, ys)
    pool.pin(slots)
    pool.mark_resident(slots, 0)
    for level, x, y, slot in zip(lv.tolist(), xs.tolist(), ys.tolist(), slots.tolist(), strict=True):
        t.set_resident(level, x, y, slot)
    loading: dict[int, tuple[int, int]] = {}  # key -> (slot, ready frame)
    cx, cy = 5, 5
    for frame in range(1, 300):
        if rng.random() < 0.3:  # the camera drifts
            cx = int(np.clip(cx + rng.integers(-1, 2), 0, 13))
            cy = int(np.clip(cy + rng.integers(-1, 2), 0, 8))
        pages = [(0, int(rng.integers(0, 2)), cx + dx, cy + dy, int(rng.integers(1, 50)))
                 for dx in range(3) for dy in range(3)]  # fmt: skip
        pages = [(tx, lvl, x >> lvl, y >> lvl, c) for tx, lvl, x, y, c in pages]
        w = WantedPages.from_tiles(pages)
        pool.touch(t.used_slots(w.level, w.x, w.y), frame)
        before_loading = set(loading)
        b = s.update(frame, w, {0: t})
        issued = b.keys.tolist()
        assert len(set(issued)) == len(issued) and not before_loading & set(issued)
        assert not t.is_resident(b.level, b.x, b.y).any()
        for i, (_, level, x, y) in enumerate(b.tuples()):  # parents first
            if level + 1 < HEADER.level_count:
                pk = key(0, level + 1, x >> 1, y >> 1)
                assert (t.is_resident(np.array([level + 1]), np.array([x >> 1]), np.array([y >> 1]))[0]
                        or pk in before_loading or pk in issued[:i]
                        or s.state_of(np.array([pk]))[0] == TileState.FAILED)  # fmt: skip
        assert len(b) <= 6 and s.in_flight_bytes <= 12 * TILE
        got = pool.allocate_many(frame, b.tex, b.level, b.x, b.y)
        for ev in pool.take_evicted().tuples():
            assert t.set_absent(*ev[2:])
        for k, slot in zip(issued, got.tolist(), strict=True):
            if slot < 0:
                s.mark_dropped(np.array([k]))
            else:
                loading[k] = (slot, frame + int(rng.integers(1, 4)))
        for k, (slot, ready) in list(loading.items()):
            if ready <= frame:
                del loading[k]
                _, level, x, y = (int(v) for v in split_tile_keys(k))
                if rng.random() < 0.05:
                    pool.free([slot])
                    s.mark_failed(np.array([k]), frame)
                else:
                    pool.mark_resident([slot], frame)
                    t.set_resident(level, x, y, slot)
                    s.mark_resident(np.array([k]))
        assert t.is_complete and t.resident_count == pool.resident_count
        pool.check()
    t.validate()
    assert s.stats.issued > 100 and s.stats.issued_prefetch > 0 and s.stats.failed > 0
