"""The request scheduler's compiled passes against numpy's, through the scheduler's own answers: the
demand (the missing chains of the wanted pages, weighed by coverage, gap and priority), the prefetch
(neighbours and children of the wanted pages under a resident parent) and the queueing (loads in
flight only marked wanted, failed tiles back after their back-off)."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.config import StreamerConfig
from texstream.pack.format import PackHeader
from texstream.runtime.compiled_loops import decider_loops
from texstream.runtime.feedback_reduce import Wanted
from texstream.runtime.page_table import PageTables
from texstream.runtime.requests import RequestScheduler
from texstream.runtime.tiles import MAX_TEXTURES, TileSpace

LOOPS = decider_loops()
pytestmark = pytest.mark.skipif(LOOPS is None, reason="the compiled helper is not built")
HEADERS = [
    PackHeader(width=1000, height=700, tile_size=64),  # 5 levels, odd edges
    PackHeader(width=4096, height=4096, tile_size=128),  # 6 levels
    PackHeader(width=256, height=128, tile_size=64),  # 3 levels
]


def world(seed: int, resident_share: float) -> tuple[TileSpace, PageTables, np.ndarray, np.random.Generator]:
    """Textures with a random part of their tiles resident (sometimes not even the coarsest level)."""
    rng = np.random.default_rng(seed)
    space = TileSpace()
    tables = PageTables(space)
    for tex, h in enumerate(HEADERS):
        space.register(tex, h)
        tables.add_texture(tex, pinned_levels=1)
    tiles = np.concatenate([space.tile_ids(t) for t in range(len(HEADERS))])
    resident = tiles[rng.random(tiles.size) < resident_share]
    tables.set_resident(resident, np.arange(resident.size))
    return space, tables, tiles, rng


def twins(space: TileSpace, tables: PageTables, priority: np.ndarray, **config: object) -> list[RequestScheduler]:
    """A numpy scheduler and a compiled one; every seventh tile id has a load in flight."""
    cfg = StreamerConfig(**({"prefetch": False, "upload_tiles_per_frame": 4096, "retry_frames": 2} | config))
    loading = lambda ids: np.asarray(ids) % 7 == 3  # noqa: E731
    assert LOOPS is not None
    return [
        RequestScheduler(cfg, space, tables, loading, priority=priority, loops=loops)
        for loops in (None, LOOPS.scheduler)
    ]


def assert_same(a: RequestScheduler, b: RequestScheduler, frame: int, wanted: Wanted, room: int) -> None:
    ra, rb = a.update(frame, wanted, room), b.update(frame, wanted, room)
    np.testing.assert_array_equal(ra.ids, rb.ids)
    np.testing.assert_array_equal(ra.prefetch, rb.prefetch)
    assert (ra.cancelled, ra.capped) == (rb.cancelled, rb.capped)
    assert a.stats == b.stats
    for name in ("state", "score", "tier", "last_wanted"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.queued_count == b.queued_count
    np.testing.assert_array_equal(a.queue, b.queue)  # the same tiles queued in the same order


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("share", [0.0, 0.3, 0.9])
def test_the_compiled_chains_order_the_same_requests_as_numpy(seed: int, share: float) -> None:
    space, tables, tiles, rng = world(seed, share)
    priority = np.ones(MAX_TEXTURES)
    if seed % 2:  # weighed by priority: rounded up and capped the same way
        priority[: len(HEADERS)] = rng.choice([0.25, 1.0, 3.5, 1e9], len(HEADERS))
    a, b = twins(space, tables, priority, prefetch=seed % 3 != 2, cancel_after_frames=2 + seed % 3)
    for frame in range(8):  # prefetch looks on even frames with room left under the caps
        if frame in (1, 2):  # failed loads: asked for again once their back-off ends (frame 3 on)
            failed = rng.choice(tiles, size=40)
            a.mark_failed(failed, frame)
            b.mark_failed(failed, frame)
        if frame == 4:  # queued tiles that arrived meanwhile leave the queue
            arrived = np.unique(rng.choice(a.queue, size=min(10, a.queue.size)))
            arrived = arrived[tables.own[arrived] < 0]
            tables.set_resident(arrived, np.arange(arrived.size) + 100_000)
        room = int(rng.integers(1, 60 if seed % 2 else 5000))  # a small room keeps tiles queued, some go stale
        ids = np.unique(rng.choice(tiles, size=int(rng.integers(1, 300))))
        counts = rng.choice([0, 1, 7, 1 << 20], ids.size)  # no coverage counts as one
        assert_same(a, b, frame, Wanted(ids.astype(np.int64), counts.astype(np.int64)), room)


def test_the_compiled_chains_agree_on_edges_and_refuse_pages_outside_the_tables() -> None:
    space, tables, tiles, _ = world(1, 1.0)
    a, b = twins(space, tables, np.ones(MAX_TEXTURES))
    everything = Wanted(tiles.astype(np.int64), np.ones(tiles.size, np.int64))
    assert_same(a, b, 0, everything, 100)  # all resident: nothing to ask for
    assert_same(a, b, 1, Wanted.empty(), 100)
    space, tables, tiles, _ = world(1, 0.0)  # nothing resident, not even the coarsest level: chains to the top
    a, b = twins(space, tables, np.ones(MAX_TEXTURES))
    assert_same(a, b, 2, Wanted(tiles[:1].astype(np.int64), np.ones(1, np.int64)), 100)
    assert_same(a, b, 3, Wanted(tiles.astype(np.int64), np.ones(tiles.size, np.int64)), 100)
    with pytest.raises(ValueError, match="outside the tables"):
        b.update(4, Wanted(np.array([space.capacity + 5], np.int64), np.ones(1, np.int64)), 100)


@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_widening_equals_numpys(seed: int) -> None:
    """A new view's pages with their same-level neighbours (`RequestScheduler.widened`): the compiled
    walk gives numpy's pages and coverage, for pages at grid edges and corners, of several textures
    and levels, and ids between textures that name no tile (kept, no neighbours)."""
    space, tables, tiles, rng = world(seed, 0.3)
    numpy_sched, compiled = twins(space, tables, np.ones(MAX_TEXTURES))
    assert LOOPS is not None and LOOPS.scheduler.widen_pages is not None  # the helper has the walk
    holes = np.array([space.ranges[t].stop for t in range(len(HEADERS) - 1)], np.int64)  # ids of no tile
    holes = holes[~space.is_tile(holes)]
    for n in (1, 7, 60, 400):
        ids = np.unique(np.concatenate([rng.choice(tiles, size=n), holes if n > 7 else holes[:0]]))
        counts = rng.integers(1, 40, ids.size).astype(np.int64)
        want = numpy_sched.widened(Wanted(ids, counts))
        got = compiled.widened(Wanted(ids, counts))
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.counts, want.counts)
        assert got.ids.size > ids.size
