"""`VirtualTexture.source_status` while streaming over HTTP from a real nginx: OK, STALE once the
pack changed on the server (the view keeps its fallback, tiles fail), and OK again with the view
converging once the server serves the opened version again."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import moderngl
import pytest

from texstream.apps.render import PlaneRenderer
from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig
from texstream.remote import SourceState
from texstream.remote.nginx import LocalNginx
from texstream.runtime.streamer import Streamer
from texstream.scene.camera import View
from texstream.testing import psnr

from ..runtime.test_streamer import CONVERGED_DB
from .test_remote_streaming import SIZE, config, converge, disk_frame

pytestmark = pytest.mark.gl


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stale-stream")
    out = {"a": root / "a.tpk", "b": root / "b.tpk"}
    bake_procedural(out["a"], 1024, "terrain", 5, BakeConfig(tile_size=64, jobs=1, progress=False))
    bake_procedural(out["b"], 1024, "terrain", 6, BakeConfig(tile_size=64, jobs=1, progress=False))
    return out


@pytest.fixture
def renderer(gl_context: moderngl.Context) -> Iterator[PlaneRenderer]:
    r = PlaneRenderer(gl_context, SIZE)
    yield r
    r.release()


def test_source_status_goes_stale_and_recovers(
    gl_context: moderngl.Context, renderer: PlaneRenderer, nginx: LocalNginx, served: Path, packs: dict
) -> None:
    path = served / "p.tpk"
    shutil.copyfile(packs["a"], path)
    opened = path.stat()
    expect = disk_frame(gl_context, renderer, packs["a"])
    with Streamer(gl_context, config(None, stale_recheck_s=0.05)) as s:
        vt = s.open(nginx.url("p.tpk"))  # the pinned levels are loaded: the fallback from now on
        assert vt.source_status.state is SourceState.OK
        shutil.copyfile(packs["b"], path)  # same size, other content and mtime: another ETag
        os.utime(path, (time.time() + 5, time.time() + 5))
        deadline = time.monotonic() + 20
        while not vt.failed_loads and time.monotonic() < deadline:  # until the streamer saw tiles fail
            s.update()
            renderer.draw(vt, View(0.5, 0.5, 1.0))
            time.sleep(0.005)
        status = vt.source_status
        assert status.state is SourceState.STALE and "changed on the server" in status.reason
        assert vt.failed_loads > 0 and s.stats().net_failed_requests > 0
        assert psnr(renderer.read(), expect) > 15.0  # the fallback levels of the opened version
        shutil.copyfile(packs["a"], path)  # the original again, its mtime too: the same ETag
        os.utime(path, ns=(opened.st_atime_ns, opened.st_mtime_ns))
        converge(s, renderer, vt)
        assert vt.source_status.state is SourceState.OK and vt.source_status.reason == ""
        assert psnr(renderer.read(), expect) >= CONVERGED_DB


def test_a_local_pack_is_always_ok(gl_context: moderngl.Context, packs: dict) -> None:
    with Streamer(gl_context, config(None)) as s:
        assert s.open(packs["a"]).source_status.state is SourceState.OK
