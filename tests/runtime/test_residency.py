"""The residency core without GL: whole frames driven by synthetic feedback.

A `Sim` plays the movers (I/O threads, uploader) with plain Python: the loads an `orders()` call
starts are "read" the next frame and "uploaded" the frame after, through the same records the real
uploader returns. The tests check orders, evictions, pins, the budget's share of slots, stale-load
cancellation, failures, shrink plans, completeness and the core's own invariants (`Residency.check`).
"""

from __future__ import annotations

import numpy as np
import pytest

from texstream.config import BudgetConfig, StreamerConfig
from texstream.errors import BudgetError
from texstream.pack.format import PackHeader
from texstream.runtime.budget import BudgetManager
from texstream.runtime.feedback_reduce import SNAPSHOT_MAX_ENTRIES
from texstream.runtime.records import Drained, LoadRecords, Uploaded
from texstream.runtime.residency import POOL_RUN_DTYPE, Residency
from texstream.runtime.slots import SlotGeometry, SlotLedger

HEADER = PackHeader(width=1024, height=1024, tile_size=128)  # levels 0..3: 8x8, 4x4, 2x2, 1x1 tiles
GEOM = SlotGeometry(slot_size=HEADER.slot_size, slot_bytes=HEADER.tile_raw_size)


class Sim:
    """A residency core plus movers simulated on the CPU (one pool, one slot per layer)."""

    def __init__(self, capacity: int = 64, textures: int = 1, **config: object) -> None:
        cfg = StreamerConfig(**({"prefetch": False, "pinned_levels": 2, "frames_in_flight": 2} | config))
        self.core = Residency(cfg, BudgetManager(BudgetConfig(budget_mb=64)))
        self.ledger = SlotLedger("pool/test", capacity, cfg.frames_in_flight)
        self.loads: dict[int, tuple[int, int]] = {}  # tile -> (cache slot, frame submitted)
        self.fail: set[int] = set()  # tiles whose reads fail
        self.submitted: list[np.ndarray] = []
        self.core.set_loading(lambda ids: np.isin(ids, np.fromiter(self.loads, np.int64, len(self.loads))))
        for tex in range(textures):
            self.open(tex)

    def open(self, tex: int) -> None:
        core = self.core
        core.register(tex, HEADER)
        core.attach(tex, HEADER, 0, self.ledger, GEOM)
        ids = core.pinned_level_ids(tex)
        slots, _ = core.reserve_now(tex, ids, pin=True, what=f"texture {tex}")
        core.loaded_now(tex, ids, slots, pinned_levels=True)

    def page(self, tex: int, level: int, x: int, y: int) -> int:
        return int(self.core.space.ranges[tex].first_tile + HEADER.tile_index(level, x, y))

    def level_pages(self, tex: int, level: int) -> np.ndarray:
        return self.core.space.tile_ids(tex, range(level, level + 1))

    def records(self, tiles: list[int]) -> LoadRecords:
        t = np.array(tiles, np.int64)
        slots = np.array([self.loads[x][0] for x in tiles], np.int64)
        return LoadRecords(t, self.core.space.tex[t].astype(np.int64), np.zeros(t.size, np.int64), slots)

    def cancel_stale(self, last_wanted: np.ndarray, since: int) -> LoadRecords:
        stale = [t for t in self.loads if last_wanted[t] < since]
        out = self.records(stale)
        for t in stale:
            del self.loads[t]
        return out

    def frame(self, feedback: np.ndarray | None = None) -> dict[str, object]:
        """One update(): observe, drain (reads one frame old finish), upload them, submit orders."""
        core = self.core
        frame = core.begin_frame()
        wanted = core.observe([np.asarray(feedback, np.uint32)] if feedback is not None else [])
        done = [t for t, (_, f) in self.loads.items() if f < frame]
        failed = [t for t in done if t in self.fail]
        drained = Drained(self.records(failed), ["bad checksum"] * len(failed), len(done) - len(failed))
        ok = [t for t in done if t not in self.fail]
        uploaded = Uploaded(
            self.records(ok), np.array([frame - self.loads[t][1] for t in ok], np.int64), len(ok) * GEOM.slot_bytes
        )
        for t in done:
            del self.loads[t]
        got_failed = core.apply(drained=drained)
        core.apply(uploaded=uploaded)
        orders = core.orders(256, self.cancel_stale)
        for t, s in zip(orders.tiles.tolist(), orders.cache_slot.tolist(), strict=True):
            assert t not in self.loads, "a tile was ordered twice"
            self.loads[t] = (s, frame)
        self.submitted.append(orders.tiles)
        core.check()
        return {"wanted": wanted, "orders": orders, "failed": got_failed, "uploaded": ok}


def test_pinned_levels_are_resident_at_open_and_count_against_no_stream_capacity() -> None:
    sim = Sim(capacity=64)
    core = sim.core
    pinned = sim.level_pages(0, 2).tolist() + sim.level_pages(0, 3).tolist()
    assert core.tables.is_resident(np.array(pinned)).all() and core.resident_tiles == 5
    assert sim.ledger.pinned_count == 5 and core.stream_capacity(0) == 64 - 5
    assert core.completeness().overall == 1.0 and core.completeness().wanted_pages == 0  # nothing wanted yet
    core.check()


def test_wanted_pages_load_parents_first_in_slot_runs_and_become_resident() -> None:
    sim = Sim(capacity=128)  # room for all 80 pages and parents: no mip bias
    want = sim.level_pages(0, 0)  # every level-0 page: their level-1 parents are missing too
    f1 = sim.frame(want)
    orders = f1["orders"]
    assert orders.runs.dtype == POOL_RUN_DTYPE
    # a fresh ledger hands one frame's loads out as one run of consecutive slots
    assert orders.runs.tolist() == [(0, 5, 5, len(orders))]
    levels = sim.core.space.level[orders.tiles]
    assert (np.diff(levels[::-1]) <= 0).all() or set(levels.tolist()) <= {0, 1}
    assert set(sim.level_pages(0, 1).tolist()) <= set(orders.tiles.tolist())  # parents asked for
    c = sim.core.completeness()
    assert c.wanted_pages == 64 and c.resident_pages == 0 and c.overall == 0.0 and not c.complete
    for _ in range(4):
        sim.frame(want)
    c = sim.core.completeness()
    assert c.complete and c.overall == 1.0 and c.per_texture == {0: 1.0}
    assert sim.core.tables.is_resident(want).all()
    assert sim.core.missing_pages(sim.core.wanted) == 0
    totals = sim.core.totals()
    assert totals.uploads == totals.requested == 64 + 16 and totals.evicted == 0


def test_under_pressure_lru_tiles_are_evicted_never_pinned_ones_and_never_in_use() -> None:
    sim = Sim(capacity=32)  # 27 streamed slots: one quadrant's 16 + 4 pages fit, two do not
    left = np.array([sim.page(0, 0, x, y) for x in range(4) for y in range(4)])
    right = np.array([sim.page(0, 0, x, y) for x in range(4, 8) for y in range(4, 8)])
    evicted: list[int] = []
    for view in [left] * 5 + [right] * 5 + [left] * 5:
        f = sim.frame(view)
        ev = f["orders"].evicted
        evicted += ev.tiles.tolist()
        assert (ev.age >= sim.core.config.frames_in_flight).all()  # nothing a frame in flight uses
    pinned = set(sim.level_pages(0, 2).tolist() + sim.level_pages(0, 3).tolist())
    assert evicted and not pinned & set(evicted)
    assert sim.core.tables.is_resident(np.array(sorted(pinned))).all()
    assert sim.ledger.used_count <= sim.ledger.capacity
    assert sim.core.tables.is_resident(left).all()  # the view came back and converged again
    assert sim.core.budget.bias == 0  # one quadrant fits: no coarsening


def test_prefetch_never_takes_the_demand_reserve() -> None:
    sim = Sim(capacity=48, prefetch=True)
    want = np.array([sim.page(0, 1, 1, 1)])
    for _ in range(6):
        sim.frame(want)
        assert sim.ledger.free_count >= min(sim.core.reserve(0), sim.ledger.capacity - sim.ledger.used_count)


def test_loads_nobody_wants_any_more_are_cancelled_and_their_slots_freed() -> None:
    sim = Sim(capacity=64, cancel_after_frames=2)
    want = sim.level_pages(0, 0)
    f = sim.frame(want)
    assert len(f["orders"])
    sim.loads = {t: (s, f_ + 100) for t, (s, f_) in sim.loads.items()}  # reads hang: nothing drains
    sim.frame(np.array([sim.page(0, 2, 0, 0)]))  # the view moved away (a pinned page)
    sim.frame(np.array([sim.page(0, 2, 0, 0)]))
    assert not sim.loads, "stale loads stayed with the I/O threads"
    assert sim.ledger.used_count == 5 and sim.core.totals().cancelled >= len(f["orders"])


def test_failed_reads_back_off_free_their_slots_and_count_per_texture() -> None:
    sim = Sim(capacity=64, textures=2, retry_frames=50)
    bad = sim.page(1, 1, 0, 0)
    sim.fail.add(bad)
    want = np.concatenate([sim.level_pages(0, 1), sim.level_pages(1, 1)])
    sim.frame(want)
    f = sim.frame(want)
    assert f["failed"].tiles.tolist() == [bad]
    assert sim.core.corrupt_tiles(1) == 1 and sim.core.corrupt_tiles(0) == 0 and sim.core.failed_loads[1] == 1
    for _ in range(5):
        f = sim.frame(want)
        assert bad not in f["orders"].tiles.tolist()  # backed off
    c = sim.core.completeness()
    assert c.per_texture[0] == 1.0 and c.per_texture[1] == 15 / 16
    assert c.resident_pages == 31 and c.wanted_pages == 32 and c.overall == 31 / 32


def test_the_bias_rises_when_the_working_set_outgrows_the_pool() -> None:
    sim = Sim(capacity=16)  # 11 streamed slots for 64 + 16 wanted pages
    for _ in range(30):
        sim.frame(sim.level_pages(0, 0))
    assert sim.core.budget.bias > 0
    assert sim.core.budget.bias_levels >= 1
    need, cap = sim.core.pressure()[0]
    assert cap == 11 and need <= cap  # the coarsened working set fits


def test_a_plan_and_a_shrink_keep_the_tables_pointing_at_their_own_tiles() -> None:
    sim = Sim(capacity=64)
    for _ in range(6):
        sim.frame(sim.level_pages(0, 0))
    plan = sim.core.plan(available=32 * GEOM.slot_bytes, max_layers=2048)
    assert plan == {0: 32}
    assert sim.core.resize_order(plan) == [0]
    result = sim.ledger.apply_shrink(sim.ledger.plan_shrink(plan[0]))
    cancelled = sim.core.apply_resize(0, result)
    assert cancelled.size == 0 and result.evicted_tiles.size > 0
    sim.core.check()  # every resident page points at a slot holding its own tile
    assert sim.core.resident_tiles == 32
    with pytest.raises(BudgetError):
        sim.core.plan(available=2 * GEOM.slot_bytes, max_layers=2048)  # below the 5 pinned tiles


def test_closing_a_texture_frees_its_slots_and_cancels_its_loads() -> None:
    sim = Sim(capacity=64, textures=2)
    sim.frame(sim.level_pages(1, 0))
    pending = list(sim.loads)
    assert pending
    empty = sim.core.detach(1, sim.records(pending))
    sim.loads.clear()
    assert not empty  # texture 0 still samples the pool
    assert sim.ledger.used_count == 5 and set(sim.core.headers) == {0}
    assert sim.core.completeness().per_texture == {0: 1.0}
    sim.core.check()
    assert sim.core.detach(0, LoadRecords.empty())  # the last texture: the pool is empty
    assert sim.core.ledgers[0] is None


def test_reserve_now_refuses_what_the_pool_cannot_hold_and_changes_nothing() -> None:
    sim = Sim(capacity=8)
    ids = sim.level_pages(0, 0)
    before = sim.ledger.used_count
    with pytest.raises(BudgetError, match=r"64 tiles need cache slots and the tile cache has \d+ to give"):
        sim.core.reserve_now(0, ids, pin=True, what="all-resident")
    assert sim.ledger.used_count == before
    sim.core.check()


def test_slots_evicted_on_demand_open_their_gates_when_the_gpu_reports_done() -> None:
    """A cut evicts tiles to load new ones: their slots may be overwritten once the GPU has finished
    the draws issued before the eviction (observe's gpu_done), not frames_in_flight frames later."""
    sim = Sim(capacity=24)
    core = sim.core
    sim.frame(sim.level_pages(0, 1))  # the 16 level-1 pages fill the stream slots (24 - 5 pinned)
    for _ in range(4):
        sim.frame(sim.level_pages(0, 1))
    cut = sim.level_pages(0, 0)[:16]  # a cut: the view moves to 16 level-0 pages under 4 parents
    for _ in range(6):  # the 12 other level-1 tiles age past frames_in_flight and make room
        orders = sim.frame(cut)["orders"]
        if len(orders.evicted):
            break
    assert len(orders.evicted) > 0
    gated = orders.cache_slot[sim.ledger.writable_at[orders.cache_slot] > core.frame]
    assert gated.size > 0  # loads into slots evicted this frame wait for the draws in flight
    core.begin_frame()
    core.observe([], gpu_done=core.frame - 3)  # the GPU is still on draws from before the eviction
    assert (sim.ledger.writable_at[gated] > core.frame).all()
    core.observe([], gpu_done=core.frame - 2)  # it finished the last frame drawn before the eviction
    assert (sim.ledger.writable_at[gated] <= core.frame).all()
    core.check()


# ---- feedback equal to the previous frame's skips the reduction -------------------------------------


def test_repeated_feedback_gives_the_same_pages_and_changed_feedback_new_ones() -> None:
    sim = Sim(textures=2)
    core = sim.core
    a = [sim.page(0, 0, 1, 1), sim.page(0, 0, 1, 1), sim.page(0, 1, 2, 0)]
    b = [sim.page(0, 0, 1, 1), sim.page(1, 0, 3, 3)]
    seen = []
    for fb in (a, a, b, b, a):
        core.begin_frame()
        seen.append(core.observe([np.array(fb, np.uint32)]))
    for fb, w in zip((a, a, b, b, a), seen, strict=True):
        ids, counts = np.unique(np.array(fb), return_counts=True)
        np.testing.assert_array_equal(w.ids, ids)
        np.testing.assert_array_equal(w.counts, counts)


def test_feedback_the_caller_changes_in_place_is_reduced_again() -> None:
    sim = Sim()
    core = sim.core
    fb = np.array([sim.page(0, 0, 0, 0), sim.page(0, 0, 1, 0)], np.uint32)
    core.begin_frame()
    core.observe([fb])
    fb[1] = sim.page(0, 0, 2, 2)  # the same array object, other entries
    core.begin_frame()
    w = core.observe([fb])
    np.testing.assert_array_equal(w.ids, np.sort(fb.astype(np.int64)))


def test_the_same_feedback_after_a_texture_opens_names_its_pages() -> None:
    sim = Sim()
    core = sim.core
    later = int(core.space.ranges[0].stop + 40)  # past texture 0's ids: names no tile yet
    fb = np.array([sim.page(0, 0, 0, 0), later], np.uint32)
    core.begin_frame()
    assert core.observe([fb]).ids.tolist() == [sim.page(0, 0, 0, 0)]
    sim.open(1)  # its ids follow texture 0's
    assert core.space.is_tile(np.array([later]))[0], "the new texture's ids cover the entry"
    core.begin_frame()
    assert core.observe([fb]).ids.tolist() == sorted([sim.page(0, 0, 0, 0), later])


def test_feedback_too_large_to_keep_is_reduced_every_frame() -> None:
    sim = Sim()
    core = sim.core
    fb = np.full(SNAPSHOT_MAX_ENTRIES + 1, sim.page(0, 0, 0, 0), np.uint32)
    for page in (sim.page(0, 0, 0, 0), sim.page(0, 0, 3, 3)):
        fb[-1] = page  # in place: only a kept copy could hide the change
        core.begin_frame()
        assert sorted(set(fb.tolist())) == core.observe([fb]).ids.tolist()
