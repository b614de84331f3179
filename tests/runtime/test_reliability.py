"""The streamer under faults and misuse: reads that hang, fail or crash their thread; a failed
all-resident load; stale reads after a fast pan; a streamer dropped without release(); calls from the
wrong thread, after the context is gone, with nonsense budgets; per-frame host memory.

Faults are injected through `Streamer(read_hook=...)`, which runs on the I/O thread before each batch
read; leaks are measured with `GLExt.live_objects()` (the driver's own answer, name by name).
"""

from __future__ import annotations

import gc
import shutil
import threading
import time
import tracemalloc
import warnings
from collections.abc import Iterator
from pathlib import Path

import moderngl
import numpy as np
import pytest

from texstream.apps.render import PlaneRenderer
from texstream.bake.pipeline import bake, bake_procedural
from texstream.bake.source import ArraySource
from texstream.config import BakeConfig, BudgetConfig, StreamerConfig
from texstream.errors import BudgetError, EngineError, TileCorruptError
from texstream.gl.gl_ext import GLExt
from texstream.pack.reader import PackReader
from texstream.runtime.io_workers import ReadBatch
from texstream.runtime.streamer import Streamer
from texstream.scene.camera import View
from texstream.testing import psnr

from .test_streamer import CONVERGED_DB, SIZE, colour_image, last_frame, reference

pytestmark = pytest.mark.gl


def config(budget_mb: float = 32.0, **kw: object) -> StreamerConfig:
    kw.setdefault("io_threads", 2)
    kw.setdefault("ring_mb", 4)
    return StreamerConfig(budget=BudgetConfig(budget_mb=budget_mb), **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("reliability")
    bc1 = BakeConfig(tile_size=64, jobs=2, progress=False)
    bake(ArraySource(colour_image(2048), "waves"), root / "colour.tpk", bc1)
    bake_procedural(root / "checker.tpk", 2048, "checker", 1, bc1)
    bad = root / "corrupt.tpk"
    shutil.copyfile(root / "colour.tpk", bad)
    with PackReader(bad) as r:
        entries = [r.entry(0, x, 5) for x in range(3, 9)]  # a few level-0 tiles
    with bad.open("r+b") as f:
        for e in entries:
            f.seek(e.offset + e.stored_size // 2)
            f.write(bytes(8))
    return {"colour": root / "colour.tpk", "checker": root / "checker.tpk", "corrupt": bad}


@pytest.fixture
def renderer(gl_context: moderngl.Context) -> Iterator[PlaneRenderer]:
    r = PlaneRenderer(gl_context, SIZE)
    yield r
    r.release()


def frames(s: Streamer, renderer: PlaneRenderer, vt, view: View, n: int) -> np.ndarray:  # noqa: ANN001
    return last_frame(s, renderer, vt, view, n)


def settled_frame(s: Streamer, renderer: PlaneRenderer, vt, view: View, n: int) -> np.ndarray:  # noqa: ANN001
    """`n` frames of `view`, then more (bounded) until nothing is missing and no load is in flight:
    the loads are asynchronous, and a busy machine needs more frames. The last frame."""
    frame = frames(s, renderer, vt, view, n)
    for _ in range(600):
        if s.last.wanted_pages > 0 and s.last.missing_pages == 0 and not s.busy:  # fed, complete, idle
            break
        frame = frames(s, renderer, vt, view, 1)
    return frame


# ---- leaks -----------------------------------------------------------------------------------
def test_release_leaves_no_gl_object(gl_context: moderngl.Context, packs: dict[str, Path]) -> None:
    gl = GLExt(gl_context)
    before = gl.live_objects()
    renderer = PlaneRenderer(gl_context, SIZE)
    renderer.release()
    s = Streamer(gl_context, config())
    a, b = s.open(packs["colour"]), s.open(packs["checker"])
    for _ in range(6):
        s.update()
        renderer = PlaneRenderer(gl_context, SIZE)
        renderer.draw(a, View(0.5, 0.5, 1.0))
        renderer.draw(b, View(0.3, 0.3, 0.5))
        renderer.release()
    s.set_budget(20.0)
    s.close(b)
    s.update()
    assert gl.live_objects().total > before.total
    s.release()
    assert gl.live_objects().minus(before) == {}
    assert s.gl.live_syncs == 0


def test_a_streamer_dropped_without_release_frees_its_gl_objects(
    gl_context: moderngl.Context, packs: dict[str, Path], renderer: PlaneRenderer
) -> None:
    gl = GLExt(gl_context)
    before = gl.live_objects()
    s = Streamer(gl_context, config())
    vt = s.open(packs["colour"])
    frames(s, renderer, vt, View(0.5, 0.5, 1.0), 4)
    with pytest.warns(ResourceWarning, match="was not released"):
        del s, vt
        gc.collect()
    assert gl.live_objects().minus(before) == {}


def test_per_frame_host_memory_does_not_grow(
    gl_context: moderngl.Context, packs: dict[str, Path], renderer: PlaneRenderer
) -> None:
    """Frames that stream nothing (converged) and frames that do: no Python allocation survives a frame
    (the feedback readback once kept two views per frame)."""
    with Streamer(gl_context, config()) as s:
        vt = s.open(packs["colour"])
        views = [View(0.2 + 0.6 * (i % 7) / 6, 0.5, 1.0) for i in range(7)]
        for v in views:  # warm up: every view's tiles and every array at its final size
            frames(s, renderer, vt, v, 8)
        gc.collect()
        tracemalloc.start()
        try:
            start = tracemalloc.take_snapshot()
            for i in range(210):
                s.update()
                renderer.draw(vt, views[(i // 30) % 7])
            gc.collect()
            grown = tracemalloc.take_snapshot().compare_to(start, "filename")
        finally:
            tracemalloc.stop()
    growth = sum(d.size_diff for d in grown if "texstream" in d.traceback[0].filename)
    assert growth < 24 * 1024, [str(d) for d in grown[:5]]


# ---- failures ------------------------------------------------------------------------------------
def test_a_failed_make_all_resident_leaves_the_streamer_usable(
    gl_context: moderngl.Context, packs: dict[str, Path], renderer: PlaneRenderer
) -> None:
    with Streamer(gl_context, config(48.0)) as s:
        vt = s.open(packs["corrupt"])
        pool = vt.pool
        free, pinned = pool.ledger.free_count, pool.ledger.pinned_count
        with pytest.raises(TileCorruptError):
            s.make_all_resident(vt)
        assert (pool.ledger.free_count, pool.ledger.pinned_count) == (free, pinned)  # nothing held back
        with pytest.raises(TileCorruptError):  # the same error again, not a BudgetError
            s.make_all_resident(vt)
        assert (pool.ledger.free_count, pool.ledger.pinned_count) == (free, pinned)
        view = View(0.5, 0.5, 1.0)
        frame = frames(s, renderer, vt, view, 24)  # streams on: everything but the bad tiles
        pool.ledger.check()
        good = s.open(packs["colour"])
        s.make_all_resident(good)  # and a good texture still goes all-resident
    ref = reference(gl_context, packs["colour"], view)
    assert psnr(frame, ref) >= 25.0


def test_an_io_thread_crash_is_one_engine_error_and_release_is_clean(
    gl_context: moderngl.Context, packs: dict[str, Path], renderer: PlaneRenderer
) -> None:
    gl = GLExt(gl_context)
    before = gl.live_objects()
    crashed = threading.Event()

    def crash_once(batch: ReadBatch) -> None:
        if not crashed.is_set():
            crashed.set()
            raise RuntimeError("disk controller on fire")

    s = Streamer(gl_context, config(retry_frames=2), read_hook=crash_once)
    vt = s.open(packs["colour"])
    with pytest.raises(EngineError, match="an I/O thread failed: RuntimeError: disk controller on fire"):
        for _ in range(60):
            s.update()
            renderer.draw(vt, View(0.5, 0.5, 1.0))
    frame = settled_frame(s, renderer, vt, View(0.5, 0.5, 1.0), 24)  # the loop goes on; the batch is retried
    assert psnr(frame, reference(gl_context, packs["colour"], View(0.5, 0.5, 1.0))) >= CONVERGED_DB
    s.release()
    assert gl.live_objects().minus(before) == {}


def test_a_hung_read_is_given_up_and_blocks_nothing(
    gl_context: moderngl.Context, packs: dict[str, Path], renderer: PlaneRenderer
) -> None:
    """One read of the colour pack never returns (until the test ends): its loads fail after the
    timeout and are retried, the other texture streams to convergence, and release() returns after
    its bounded wait."""
    gate = threading.Event()
    hung = threading.Event()

    def hang_first_colour_batch(batch: ReadBatch) -> None:
        if "colour" in batch.source.name and not hung.is_set():
            hung.set()
            gate.wait(60)

    cfg = config(read_timeout_s=0.3, shutdown_wait_s=0.2, retry_frames=2)
    s = Streamer(gl_context, cfg, read_hook=hang_first_colour_batch)
    try:
        colour, checker = s.open(packs["colour"]), s.open(packs["checker"])
        other = PlaneRenderer(gl_context, SIZE)
        view = View(0.5, 0.5, 1.0)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                s.update()
                renderer.draw(colour, view)
                other.draw(checker, view)
                if hung.is_set() and s.stats().totals.failed and not s.busy and s.last.missing_pages == 0:
                    break
                time.sleep(0.005)
            assert hung.is_set()
            assert s.stats().totals.failed > 0  # the hung batch's loads, given up
            assert s.io_status().stuck_threads == 1
            got_checker = other.read()
            got_colour = renderer.read()
        finally:
            other.release()
        assert psnr(got_checker, reference(gl_context, packs["checker"], view)) >= CONVERGED_DB
        assert psnr(got_colour, reference(gl_context, packs["colour"], view)) >= CONVERGED_DB  # retried
        t0 = time.monotonic()
        s.release()
        assert time.monotonic() - t0 < 5.0  # the bounded wait, not the hung read
    finally:
        gate.set()
        s.release()


def test_reads_nobody_wants_any_more_are_cancelled(
    gl_context: moderngl.Context, packs: dict[str, Path], renderer: PlaneRenderer
) -> None:
    """Slow reads (30 ms a batch, one thread) and a fast pan: reads queued for views already left are
    cancelled (the thread skips them), so the final view is not stuck behind them."""

    def slow(batch: ReadBatch) -> None:
        time.sleep(0.03)

    cfg = config(64.0, io_threads=1, cancel_after_frames=3, prefetch=False)
    with Streamer(gl_context, cfg, read_hook=slow) as s:
        vt = s.open(packs["checker"])
        for i in range(40):  # a pan across the whole texture, a new place every frame
            s.update()
            renderer.draw(vt, View(0.1 + 0.8 * (i % 20) / 19, 0.1 + 0.8 * (i // 20), 1.0))
        assert s.stats().totals.cancelled > 0
        final = View(0.5, 0.5, 1.0)
        frames = 0
        fed = lambda: s.last.wanted_pages > 0  # noqa: E731 (its feedback read: nothing is missing before that)
        while frames < 400 and not (frames > 4 and fed() and s.last.missing_pages == 0 and not s.busy):
            s.update()
            renderer.draw(vt, final)
            frames += 1
            time.sleep(0.002)
        assert s.last.missing_pages == 0 and s.io_status().pending_batches == 0
        # The pan asked for ~20 batches (~0.6 s of reads, 300 frames of 2 ms): settled well before.
        assert frames <= 100, f"{frames} frames to settle: stale reads were not skipped"


# ---- misuse ------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0, "64", None])
def test_set_budget_rejects_nonsense(gl_context: moderngl.Context, value: object) -> None:
    with Streamer(gl_context, config()) as s:
        with pytest.raises(ValueError, match="budget must be"):
            s.set_budget(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -5.0])
def test_budget_config_rejects_nonsense(value: float) -> None:
    with pytest.raises(ValueError, match="budget must be"):
        BudgetConfig(budget_mb=value)


def test_calls_from_another_thread_are_refused(gl_context: moderngl.Context, packs: dict[str, Path]) -> None:
    with Streamer(gl_context, config()) as s:
        vt = s.open(packs["colour"])
        errors: list[BaseException] = []

        def other() -> None:
            for call in (s.update, lambda: s.set_budget(16.0), lambda: s.close(vt), s.release):
                try:
                    call()
                except EngineError as exc:
                    errors.append(exc)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert len(errors) == 4 and all("thread" in str(e) for e in errors)
        s.update()  # still fine on its own thread
        assert not vt.closed


def test_use_after_the_context_is_gone_is_one_clear_error(packs: dict[str, Path]) -> None:
    from texstream.gl.context import headless_context

    ctx = headless_context()
    s = Streamer(ctx, config())
    s.open(packs["colour"])
    s.update()
    ctx.release()
    with pytest.raises(EngineError, match="context was released"):
        s.update()
    with pytest.raises(EngineError, match="context was released"):
        s.release()
    s.release()  # once said, release() is a no-op


def test_closing_a_texture_or_its_reader_mid_stream_corrupts_nothing(
    gl_context: moderngl.Context, packs: dict[str, Path], renderer: PlaneRenderer
) -> None:
    view = View(0.5, 0.5, 1.0)
    with Streamer(gl_context, config()) as s:
        a = s.open(packs["colour"])
        b = s.open(packs["checker"])
        s.update()
        renderer.draw(b, view)
        s.update()
        a.reader.close()  # the user's handle: the streamer reads through its own
        b.close()  # same as s.close(b)
        assert b.closed and b not in s.textures
        frame = settled_frame(s, renderer, a, view, 30)
        assert s.stats().corrupt_tiles == 0
    assert psnr(frame, reference(gl_context, packs["colour"], view)) >= CONVERGED_DB


def test_budget_error_is_not_confused_with_corruption(gl_context: moderngl.Context, packs: dict[str, Path]) -> None:
    with Streamer(gl_context, config(4.0)) as s:
        vt = s.open(packs["colour"])
        with pytest.raises(BudgetError):
            s.make_all_resident(vt)
        s.update()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gc.collect()
