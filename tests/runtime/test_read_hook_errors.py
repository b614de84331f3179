"""An exception from the I/O threads' `read_hook` (the fault-injection point) surfaces once per
texture while its batches keep failing, not once per batch: the rest are counted (failed loads), the
loop goes on with the fallback, and a new failure after a clean read is reported again."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path

import moderngl
import pytest

from texstream.apps.render import PlaneRenderer
from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig, BudgetConfig, StreamerConfig
from texstream.errors import EngineError
from texstream.runtime.io_workers import ReadBatch
from texstream.runtime.streamer import Streamer, VirtualTexture
from texstream.scene.camera import View

pytestmark = pytest.mark.gl

VIEW = View(0.5, 0.5, 1.0)


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("read-hook") / "checker.tpk"
    bake_procedural(path, 2048, "checker", 1, BakeConfig(tile_size=64, jobs=1, progress=False))
    return path


def frames_until(
    s: Streamer,
    renderer: PlaneRenderer,
    vt: VirtualTexture,
    done: Callable[[], bool],
    view: View = VIEW,
    seconds: float = 30.0,
) -> list[str]:
    """Frames of `view` until `done()`; the EngineErrors update() raised on the way."""
    raised: list[str] = []
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"not done in {seconds} s: {s.stats()}"
        try:
            s.update()
        except EngineError as exc:
            raised.append(str(exc))
        renderer.draw(vt, view)
        time.sleep(0.002)
    return raised


def test_a_failing_read_hook_is_reported_once_and_counted(gl_context: moderngl.Context, pack: Path) -> None:
    failing = threading.Event()
    calls = {"failed": 0}

    def disk_gone(batch: ReadBatch) -> None:
        if failing.is_set():
            calls["failed"] += 1
            raise OSError(errno.EIO, "injected read error")

    cfg = StreamerConfig(budget=BudgetConfig(budget_mb=32), io_threads=2, ring_mb=4, retry_frames=2)
    renderer = PlaneRenderer(gl_context, (256, 256))
    try:
        with Streamer(gl_context, cfg, read_hook=disk_gone) as s:
            vt = s.open(pack)  # the pinned levels load before the hook fails
            failing.set()
            raised = frames_until(s, renderer, vt, lambda: calls["failed"] >= 4)
            assert len(raised) == 1, raised
            assert "injected read error" in raised[0] and "\n" not in raised[0]
            assert vt.failed_loads >= 4  # every failing batch's tiles are counted as failed loads
            failing.clear()  # the disk is back: the view streams, the episode is over
            fed_and_done = lambda: s.frame > 5 and s.last.wanted_pages > 0 and s.last.missing_pages == 0 and not s.busy  # noqa: E731
            frames_until(s, renderer, vt, fed_and_done)
            failing.set()  # a new failure is news again: reported once more
            calls["failed"] = 0
            closer = View(0.3, 0.3, 4.0)  # finer tiles than are resident: new reads
            again = frames_until(s, renderer, vt, lambda: calls["failed"] >= 4, closer)
            assert len(again) == 1, again
    finally:
        renderer.release()
