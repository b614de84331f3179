"""Dense feedback after a camera cut (`FeedbackBursts`): a jump of the wanted pages starts a burst of
dense frames, then as many normal frames before the next one; pans, small views and a still view
never start one."""

from __future__ import annotations

import time
from pathlib import Path

import moderngl
import numpy as np
import pytest

from texstream.apps.render import PlaneRenderer
from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig, BudgetConfig, StreamerConfig
from texstream.gl.gl_ext import GLExt
from texstream.runtime.budget import BudgetManager
from texstream.runtime.feedback import BURST_BUDGET_SHARE, FeedbackRing
from texstream.runtime.feedback_bursts import JUMP_MIN_PAGES, BurstState, FeedbackBursts, new_share
from texstream.runtime.feedback_reduce import CompactFeedback
from texstream.runtime.streamer import Streamer
from texstream.scene.camera import View


def pages(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int64)


def run(bursts: FeedbackBursts, feedback: list[np.ndarray | None]) -> list[bool]:
    return [bursts.step(p) for p in feedback]


def test_new_share_counts_the_pages_not_seen_before() -> None:
    assert new_share(pages(0, 10), pages(5, 10)) == (5, 0.5)
    assert new_share(pages(0, 4), np.zeros(0, np.int64)) == (4, 1.0)
    assert new_share(np.zeros(0, np.int64), pages(0, 3)) == (0, 0.0)
    assert new_share(np.array([1, 7, 30]), np.array([0, 7, 29])) == (2, 2 / 3)  # past the end and between


def test_a_jump_makes_the_next_frames_dense_then_they_return() -> None:
    b = FeedbackBursts(4)
    a, c = pages(0, 100), pages(1000, 100)
    assert run(b, [a] + [None, a] * 6) == [True] * 4 + [False] * 9  # the first feedback is a jump
    assert b.state is BurstState.SPARSE and b.bursts == 1
    dense = run(b, [c, c, None, c, c, c, c, c, c, c])  # a cut
    assert dense == [True] * 4 + [False] * 6 and b.bursts == 2


def test_jumped_names_the_frame_whose_feedback_shows_the_jump_in_any_state() -> None:
    """`jumped` is true on the step whose pages jumped (the first feedback, a cut, an announced cut's
    first feedback during its burst) and on no other: not on a frame without feedback, a still or
    slowly changing view, or the dense frames after."""
    b = FeedbackBursts(4)
    a, c, d = pages(0, 100), pages(1000, 100), pages(2000, 100)
    got = []
    for p in [a, a, None, a, pages(10, 100), c, c, None, c]:
        b.step(p)
        got.append(b.jumped)
    assert got == [True, False, False, False, False, True, False, False, False]
    b.cut()
    b.step(c)  # the announced cut's update reads the old view's feedback
    assert not b.jumped and b.state is BurstState.BURST
    b.step(d)  # then the new view's: a jump inside the burst it already started
    assert b.jumped and b.bursts == 2  # the jump at step 5 came while settling: no burst, still named
    off = FeedbackBursts(0)  # no bursts, but a jump is still named
    off.step(a)
    assert off.jumped and off.bursts == 0


def test_a_jump_while_settling_starts_nothing_and_a_later_one_does() -> None:
    b = FeedbackBursts(2)
    views = [pages(i * 1000, 50) for i in range(6)]
    # a cut every frame: dense 2 frames, settle 2, dense 2, ...: at most half the frames dense
    assert run(b, views[:6]) == [True, True, False, False, True, True]
    assert b.state is BurstState.BURST


def test_pans_small_views_and_a_still_view_never_burst() -> None:
    b = FeedbackBursts(4)
    run(b, [pages(0, 200)] * 9)  # the first feedback's burst and its settling
    assert b.state is BurstState.SPARSE
    pan = [pages(10 * i, 200) for i in range(1, 30)]  # 5 % of the pages new each frame
    assert not any(run(b, pan))
    small = [pages(5000 + 100 * i, JUMP_MIN_PAGES - 1) for i in range(10)]  # all new, but a few pages
    assert not any(run(b, small)) and b.bursts == 1
    assert not any(run(b, [None] * 10))  # nothing read: nothing changes


def test_no_bursts_when_disabled_and_bad_frames_refused() -> None:
    b = FeedbackBursts(0)
    assert not any(run(b, [pages(i * 100, 50) for i in range(10)])) and b.bursts == 0
    with pytest.raises(ValueError, match="-1"):
        FeedbackBursts(-1)


# ---- on the GPU: the draws follow the stride a frame's buffer header names ---------------------------
@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bursts") / "checker.tpk"
    bake_procedural(path, 1024, "checker", 1, BakeConfig(tile_size=64, progress=False))
    return path


def strides_and_entries(
    s: Streamer,
    renderer: PlaneRenderer,
    vt,  # noqa: ANN001
    views: list[View],
    announce: int | None = None,
) -> list[tuple[int, int]]:
    """(stride of the coming draw, entries it recorded) a frame; each frame finished before the next.
    `announce`: the frame before whose update `Streamer.camera_cut()` is called."""
    out = []
    for i, view in enumerate(views):
        if i == announce:
            s.camera_cut()
        st = s.update()
        renderer.draw(vt, view)
        s.ctx.finish()
        out.append((st.feedback_stride, s.current_feedback().size))
    return out


@pytest.mark.gl
@pytest.mark.parametrize("burst", [4, 0])
def test_after_a_cut_the_draws_record_denser_feedback_then_return(
    gl_context: moderngl.Context, pack: Path, burst: int
) -> None:
    """A Streamer on a GPU that finishes each frame: the draws after a cut record four times the entries."""
    a, b = View(0.3, 0.3, 0.5, 40.0, 0.0), View(0.7, 0.7, 0.5, 40.0, 180.0)
    renderer = PlaneRenderer(gl_context, (256, 256))
    cfg = StreamerConfig(budget=BudgetConfig(budget_mb=32), feedback_burst_frames=burst, prefetch=False)
    try:
        with Streamer(gl_context, cfg) as s:
            vt = s.open(pack)
            got = strides_and_entries(s, renderer, vt, [a] * 12 + [b] * 12)
    finally:
        renderer.release()
    strides = [g[0] for g in got]
    if not burst:
        assert strides == [8] * 24
        return
    # update 1 reads no feedback yet; update 2 reads the first draw's (a jump from nothing): dense
    # draws 2-5; the cut's first draw (12) is read by update 13: dense draws 13-16, then normal
    assert strides == [8] + [4] * 4 + [8] * 8 + [4] * 4 + [8] * 7
    sparse = [n for st, n in got[6:12]]
    dense = [n for st, n in got[13:17]]
    assert min(sparse) > 100 and min(dense) > 3 * max(sparse)  # four times the fragments record


@pytest.mark.gl
def test_buffers_are_sized_for_dense_frames_only_within_their_budget_share(gl_context: moderngl.Context) -> None:
    gl = GLExt(gl_context)
    size = (1920, 1080)
    cfg = StreamerConfig()
    sparse, dense = FeedbackRing.capacity_for(size, 8), FeedbackRing.capacity_for(size, 4)
    assert dense == 4 * sparse
    for budget_mb, capacity, full_size_stride in ((192, dense, 4), (64, sparse, 8)):
        budget = BudgetManager(BudgetConfig(budget_mb=budget_mb))
        ring = FeedbackRing.reserved(gl_context, gl, budget, size, cfg)
        try:
            assert ring.capacity == capacity and budget.reserved("feedback") == ring.nbytes
            assert ring.nbytes <= max(FeedbackRing.bytes_for(sparse), budget.budget * BURST_BUDGET_SHARE)
            assert ring.dense_stride == full_size_stride
            assert ring.densest_stride((960, 540)) == 4  # half the size: the entries fit either way
            assert ring.begin_frame(1, dense=True) == full_size_stride and ring.begin_frame(2) == 8
        finally:
            ring.release(budget)
    budget = BudgetManager(BudgetConfig(budget_mb=192))
    off = FeedbackRing.reserved(gl_context, gl, budget, size, StreamerConfig(feedback_burst_frames=0))
    try:
        assert off.capacity == sparse and off.dense_stride == 8  # not sized for dense frames
        assert off.densest_stride((960, 540)) == 4
    finally:
        off.release(budget)


def test_a_ring_sized_for_dense_frames_lets_its_normal_frames_take_only_their_share(
    gl_context: moderngl.Context,
) -> None:
    """A normal frame of a ring sized for dense frames may append what its own stride needs (a
    quarter): its compaction and readback cover only that; a dense frame may fill the ring, and a
    wider viewport raises a normal frame's share with it."""
    gl = GLExt(gl_context)
    size = (1920, 1080)
    sparse, dense = FeedbackRing.capacity_for(size, 8), FeedbackRing.capacity_for(size, 4)
    budget = BudgetManager(BudgetConfig(budget_mb=192))
    ring = FeedbackRing.reserved(gl_context, gl, budget, size, StreamerConfig())
    try:
        assert ring.capacity == dense
        assert ring.frame_capacity(8) == sparse and ring.frame_capacity(4) == dense
        ring.begin_frame(1)
        assert ring.inject(np.arange(sparse + 100, dtype=np.uint32))
        assert ring.read_current().size == sparse  # a normal frame keeps its share
        ring.end_frame()
        gl_context.finish()
        (got,) = ring.collect(2)
        assert np.asarray(got).size == sparse  # raw entries (no ids tracked: no compaction), the frame's share
        ring.begin_frame(2, dense=True)
        assert ring.inject(np.arange(sparse + 100, dtype=np.uint32))
        assert ring.read_current().size == sparse + 100  # a dense frame may fill the ring
        assert ring.fitted((0, 0, 2400, 1200), budget, StreamerConfig()) is ring  # still fits at 8
        assert ring.frame_capacity(8) == FeedbackRing.capacity_for((2400, 1200), 8) > sparse
    finally:
        ring.release(budget)
    # compacted on the GPU: a normal frame's dispatch covers its share, and counts every entry in it
    ring = FeedbackRing.reserved(gl_context, gl, budget, size, StreamerConfig())
    try:
        ring.track_ids(5000, budget)
        if not ring.compacting:
            pytest.skip("no feedback compaction on this context")
        ids = np.random.default_rng(3).integers(0, 5000, sparse).astype(np.uint32)
        ring.begin_frame(1)
        assert ring.inject(ids)
        ring.end_frame()
        gl_context.finish()
        (got,) = ring.collect(2)
        assert isinstance(got, CompactFeedback) and got.samples == sparse and int(got.counts.sum()) == sparse
        order = np.argsort(got.ids)
        want_ids, want_counts = np.unique(ids, return_counts=True)
        assert np.array_equal(got.ids[order], want_ids) and np.array_equal(got.counts[order], want_counts)
    finally:
        ring.release(budget)


def test_an_announced_cut_makes_the_next_frame_dense_and_its_jump_starts_nothing_more() -> None:
    b = FeedbackBursts(3)
    run(b, [pages(0, 100)] * 8)
    assert b.state is BurstState.SPARSE and b.bursts == 1
    b.cut()  # before the update of the cut's first frame
    # that update reads the old view's feedback; its draws are dense, and the next two; the new
    # view's feedback (a jump) arrives two updates later, inside the burst
    got = run(b, [pages(0, 100), pages(0, 100), pages(500, 100), pages(500, 100)] + [pages(500, 100)] * 6)
    assert got == [True] * 3 + [False] * 7 and b.bursts == 2
    b.cut()  # while settling or sparse alike, an announced cut starts at once
    assert b.step(None) and b.bursts == 3
    off = FeedbackBursts(0)
    off.cut()
    assert not off.step(None)


@pytest.mark.gl
def test_an_announced_cut_makes_its_first_draws_dense(gl_context: moderngl.Context, pack: Path) -> None:
    a, b = View(0.3, 0.3, 0.5, 40.0, 0.0), View(0.7, 0.7, 0.5, 40.0, 180.0)
    renderer = PlaneRenderer(gl_context, (256, 256))
    cfg = StreamerConfig(budget=BudgetConfig(budget_mb=32), prefetch=False)
    try:
        with Streamer(gl_context, cfg) as s:
            vt = s.open(pack)
            got = strides_and_entries(s, renderer, vt, [a] * 12 + [b] * 12, announce=12)
    finally:
        renderer.release()
    # the cut's own draw (12) and the next three are dense, one frame before the feedback shows it
    assert [g[0] for g in got] == [8] + [4] * 4 + [8] * 7 + [4] * 4 + [8] * 8


def frames_until_complete(s: Streamer, renderer: PlaneRenderer, vt, views: list[View], hold: int) -> list[int]:  # noqa: ANN001
    """Per cut: frames from the cut until an update finds nothing missing for feedback drawn after it
    (each frame finished before the next, the reads given a moment, as a paced loop gives them)."""
    out = []
    for view in views:
        cut_frame = s.frame
        for k in range(hold):
            st = s.update()
            renderer.draw(vt, view)
            s.ctx.finish()
            time.sleep(0.005)
            fresh = st.feedback_age >= 0 and st.frame - st.feedback_age > cut_frame
            if fresh and st.wanted_pages and st.missing_pages == 0:
                out.append(k)
                break
        else:
            out.append(hold)
    return out


@pytest.mark.gl
def test_a_cut_loads_the_new_views_neighbours_at_once_and_settles_sooner(
    gl_context: moderngl.Context, pack: Path
) -> None:
    """Unannounced cuts on a tilted plane: with `cut_neighbours` the frame whose feedback shows the cut
    also loads the same-level neighbours of the new view's pages, the pages its sparse feedback missed,
    so cuts settle no later, some a round trip sooner; without, those pages wait for later feedback."""
    rng = np.random.default_rng(5)
    views = [View(*rng.uniform(0.2, 0.8, 2), 0.5, 60.0, float(rng.uniform(0, 360))) for _ in range(8)]
    got = {}
    for widen in (True, False):
        renderer = PlaneRenderer(gl_context, (256, 256))
        cfg = StreamerConfig(budget=BudgetConfig(budget_mb=32), prefetch=False, cut_neighbours=widen)
        try:
            with Streamer(gl_context, cfg) as s:
                vt = s.open(pack)
                frames_until_complete(s, renderer, vt, [views[-1]], 40)  # settle on a first view
                got[widen] = frames_until_complete(s, renderer, vt, views, 40)
        finally:
            renderer.release()
    assert max(got[True]) < 40 and sum(got[True]) < sum(got[False]), got
    assert sum(a <= b for a, b in zip(got[True], got[False], strict=True)) >= 7, got
