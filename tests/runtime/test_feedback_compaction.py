"""Feedback compaction on the GPU (shaders/vt_feedback_compact.glsl): the unique pages and counts it
reads back equal the CPU reduction of the same entries, frame after frame (its counters start from
zero each time), and a streamer reduces the same wanted pages with it as without it."""

from __future__ import annotations

import moderngl
import numpy as np
import pytest

from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig, BudgetConfig, StreamerConfig
from texstream.gl.gl_ext import GLExt
from texstream.runtime.budget import BudgetManager
from texstream.runtime.feedback import FeedbackCompactor, FeedbackRing
from texstream.runtime.feedback_reduce import CompactFeedback, histogram_counts
from texstream.runtime.streamer import Streamer

pytestmark = pytest.mark.gl


@pytest.fixture
def ring(gl_context: moderngl.Context):  # noqa: ANN201
    gl = GLExt(gl_context)
    if not FeedbackCompactor.available(gl_context, gl):
        pytest.skip("no compute shaders or persistent mapping on this context")
    budget = BudgetManager(BudgetConfig(budget_mb=64))
    r = FeedbackRing(gl_context, gl, capacity=6000, stride=8, depth=3, compact=True)
    budget.reserve("feedback", r.nbytes)
    r.track_ids(5000, budget)
    yield r, budget
    r.release(budget)


def compacted(gl_context: moderngl.Context, r: FeedbackRing, frame: int, entries: np.ndarray) -> CompactFeedback:
    """`entries` injected into frame `frame`'s buffer, compacted and read back."""
    r.begin_frame(frame)
    assert r.inject(entries)
    r.end_frame()
    gl_context.finish()
    (got,) = r.collect(frame + 1)
    assert isinstance(got, CompactFeedback)
    assert r.completed == frame  # its fence signalled: the GPU finished that frame's work
    return got


def test_the_gpu_list_equals_the_cpu_reduction_every_frame(gl_context: moderngl.Context, ring) -> None:  # noqa: ANN001
    r, budget = ring
    assert r.compacting and budget.reserved("feedback-compaction") > 0
    rng = np.random.default_rng(7)
    for frame in range(1, 6):  # the ring wraps: every buffer is compacted twice through one work buffer
        hot = rng.integers(0, 5000, rng.integers(1, 400))
        entries = rng.choice(hot, rng.integers(1, 6000)).astype(np.uint32)
        junk = rng.random(entries.size) < 0.05
        entries[junk] = rng.choice(np.array([5000, 5001, 1 << 20, 0xFFFFFFFF], np.uint32), int(junk.sum()))
        got = compacted(gl_context, r, frame, entries)
        order = np.argsort(got.ids)
        ids, counts, outside = histogram_counts(entries, 5000)
        assert got.ids[order].tolist() == ids.tolist(), frame
        assert got.counts[order].tolist() == counts.tolist(), frame
        assert (got.samples, got.invalid) == (entries.size, outside), frame


def test_an_empty_frame_lists_nothing(gl_context: moderngl.Context, ring) -> None:  # noqa: ANN001
    r, _ = ring
    compacted(gl_context, r, 1, np.arange(100, dtype=np.uint32))
    got = compacted(gl_context, r, 2, np.zeros(0, np.uint32))
    assert got.ids.size == got.counts.size == got.samples == got.invalid == 0


def test_more_ids_grow_the_counters(gl_context: moderngl.Context, ring) -> None:  # noqa: ANN001
    r, budget = ring
    before = budget.reserved("feedback-compaction")
    r.track_ids(200_000, budget)
    assert budget.reserved("feedback-compaction") > before
    entries = np.array([199_999, 150_000, 199_999, 200_000], np.uint32)
    got = compacted(gl_context, r, 1, entries)
    assert sorted(zip(got.ids.tolist(), got.counts.tolist(), strict=True)) == [(150_000, 1), (199_999, 2)]
    assert got.invalid == 1


def test_no_room_in_the_budget_falls_back_to_the_cpu(gl_context: moderngl.Context) -> None:
    gl = GLExt(gl_context)
    budget = BudgetManager(BudgetConfig(budget_mb=1))
    r = FeedbackRing(gl_context, gl, capacity=6000, stride=8, depth=3, compact=True)
    try:
        budget.reserve("feedback", budget.budget - 1000)  # everything but a few bytes
        r.track_ids(5000, budget)
        assert not r.compacting and budget.reserved("feedback-compaction") == 0
        r.begin_frame(1)
        r.inject(np.array([3, 3, 4], np.uint32))
        r.end_frame()
        gl_context.finish()
        (raw,) = r.collect(2)
        assert sorted(raw.tolist()) == [3, 3, 4]  # the raw entries, for the CPU to reduce
    finally:
        r.release(budget)


def test_a_streamer_wants_the_same_pages_with_and_without_compaction(
    gl_context: moderngl.Context, tmp_path_factory: pytest.TempPathFactory
) -> None:
    pack = tmp_path_factory.mktemp("compaction") / "checker.tpk"
    bake_procedural(pack, 1024, "checker", 1, BakeConfig(tile_size=64, progress=False))
    seen = {}
    for compaction in (True, False):
        rng = np.random.default_rng(8)  # the same entries on both streamers
        cfg = StreamerConfig(budget=BudgetConfig(budget_mb=64), feedback_compaction=compaction)
        with Streamer(gl_context, cfg) as s:
            vt = s.open(pack)
            assert s.feedback_info().compacted is (compaction and FeedbackCompactor.available(gl_context, s.gl))
            ids = vt.table.ids(rng.integers(0, 3, 3000), rng.integers(0, 4, 3000), rng.integers(0, 4, 3000))
            entries = np.concatenate([ids, [vt.tiles.start, 1 << 30]]).astype(np.uint32)  # a header id, junk
            s.update()
            assert s.inject_feedback(entries)
            gl_context.finish()
            s.update()  # reads the injected frame back (the GPU has finished it)
            w = s.sampled_pages
            seen[compaction] = (w.ids.tolist(), w.counts.tolist())
            s.validate()
    assert seen[True] == seen[False] and sum(seen[True][1]) == 3000


def test_a_ring_told_compaction_costs_more_reads_raw_entries_with_the_same_pages(gl_context, ring) -> None:  # noqa: ANN001
    r, _ = ring
    entries = np.array([7, 7, 9, 4999, 5000], np.uint32)  # 5000: past the ids in use
    probe = r.choice.probe_frames
    frame = 0
    for _ in range(probe):  # compaction is measured first: each frame's feedback took 2 ms
        frame += 1
        got = compacted(gl_context, r, frame, entries)
        r.record_cost([got], 2e-3)
    assert not r.compacting  # the CPU reduction is measured next
    for _ in range(probe):
        frame += 1
        r.begin_frame(frame)
        assert r.inject(entries)
        r.end_frame()
        gl_context.finish()
        (raw,) = r.collect(frame + 1)
        assert not isinstance(raw, CompactFeedback) and sorted(raw.tolist()) == sorted(entries.tolist())
        r.record_cost([raw], 1e-3)  # cheaper than compacting
    assert not r.compacting and r.choice.chosen is False
    ids, counts, outside = histogram_counts(raw, 5000)
    assert (ids.tolist(), counts.tolist(), outside) == ([7, 9, 4999], [2, 1, 1], 1)


def test_compaction_adds_no_frame_between_a_draw_and_its_request(
    gl_context: moderngl.Context, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """On a GPU that keeps up (each frame finished before the next update), a page drawn in frame N is
    wanted and requested by update N + 1, compacted or not."""
    pack = tmp_path_factory.mktemp("compaction-latency") / "checker.tpk"
    bake_procedural(pack, 1024, "checker", 1, BakeConfig(tile_size=64, progress=False))
    seen = {}
    for compaction in (True, False):
        cfg = StreamerConfig(budget=BudgetConfig(budget_mb=64), feedback_compaction=compaction, prefetch=False)
        with Streamer(gl_context, cfg) as s:
            vt = s.open(pack)
            page = vt.table.ids(np.array([0]), np.array([5]), np.array([9])).astype(np.uint32)
            s.update()
            drawn = s.frame  # update() opened this frame's feedback buffer: the "draw" writes into it
            assert s.inject_feedback(np.repeat(page, 50))
            gl_context.finish()
            frames = []
            for _ in range(3):
                st = s.update()
                frames.append((st.frame - drawn, st.wanted_pages, st.requested, s.feedback_info().compacted))
                gl_context.finish()
            seen[compaction] = [f[:3] for f in frames]
            assert frames[0][3] is (compaction and FeedbackCompactor.available(gl_context, s.gl))
    assert seen[True] == seen[False]
    assert seen[True][0][0] == 1 and seen[True][0][1] == 1 and seen[True][0][2] >= 1  # wanted, requested at once


def test_the_list_is_as_long_as_the_ids_in_use_and_a_buffer_compacted_before_it_grows_reads_right(
    gl_context: moderngl.Context,
) -> None:
    """Buffers sized for many entries (dense frames) need no longer a list than the ids in use: the
    work buffer follows the ids, and a buffer compacted before a texture opened (the list longer
    from then on) is still read with its own list's layout."""
    gl = GLExt(gl_context)
    if not FeedbackCompactor.available(gl_context, gl):
        pytest.skip("no compute shaders or persistent mapping on this context")
    budget = BudgetManager(BudgetConfig(budget_mb=64))
    r = FeedbackRing(gl_context, gl, capacity=20000, stride=8, depth=3, compact=True)
    try:
        budget.reserve("feedback", r.nbytes)
        r.track_ids(3000, budget)
        c = r.compactor
        assert c is not None and c.list_capacity == 4096 < r.capacity
        assert budget.reserved("feedback-compaction") == c.bytes_for(3000) < (4 + 2 * 20000 + 4096) * 4
        rng = np.random.default_rng(3)
        entries = rng.integers(0, 3000, 20000).astype(np.uint32)  # every entry slot, most ids once or more
        r.begin_frame(1)
        assert r.inject(entries)
        r.end_frame()
        r.track_ids(9000, budget)  # a texture opens before the buffer is read: a longer list
        assert c.list_capacity == 12288
        gl_context.finish()
        (got,) = r.collect(2)
        assert isinstance(got, CompactFeedback)
        ids, counts, _ = histogram_counts(entries, 3000)
        order = np.argsort(got.ids)
        assert got.ids[order].tolist() == ids.tolist() and got.counts[order].tolist() == counts.tolist()
        wide = rng.integers(0, 9000, 20000).astype(np.uint32)  # and with the new layout
        got = compacted(gl_context, r, 3, wide)
        ids, counts, _ = histogram_counts(wide, 9000)
        order = np.argsort(got.ids)
        assert got.ids[order].tolist() == ids.tolist() and got.counts[order].tolist() == counts.tolist()
    finally:
        r.release(budget)
