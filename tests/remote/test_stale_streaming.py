"""Streaming over HTTP through failures: `VirtualTexture.source_status` from a real nginx (OK, STALE
once the pack changed on the server while the view keeps its fallback, OK again with the view
converging once the server serves the opened version again), and transient failures mid-stream
retried and counted in the network summary."""

from __future__ import annotations

import http.server
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
from .conftest import ScriptedServer, reset, send
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


def test_transient_failures_mid_stream_are_retried_and_counted(
    gl_context: moderngl.Context, renderer: PlaneRenderer, scripted: ScriptedServer, packs: dict
) -> None:
    """Every range's first try answered 503 or cut by a reset, as a loaded server or a proxy does:
    the view converges with no failed tile, and the network summary counts one retry per failure."""
    data = packs["a"].read_bytes()
    scripted.files["p.tpk"] = data
    tried: set[str | None] = set()

    def first_try_fails(h: http.server.BaseHTTPRequestHandler, n: int) -> bool:
        asked = h.headers.get("Range")
        if n == 0 or asked in tried:
            return False
        tried.add(asked)
        if len(tried) % 2:
            send(h, 503, {"Retry-After": "0", "Content-Length": "0"})
        else:
            reset(h)
        return True

    scripted.script = first_try_fails
    expect = disk_frame(gl_context, renderer, packs["a"])
    with Streamer(gl_context, config(None, retries=1)) as s:
        vt = s.open(scripted.url())
        converge(s, renderer, vt)
        net = s.network()
        assert psnr(renderer.read(), expect) >= CONVERGED_DB
        assert s.stats().totals.failed == 0 and vt.failed_loads == 0
    assert len(tried) >= 4
    assert net.failed_requests == len(tried) and net.retries == len(tried)
