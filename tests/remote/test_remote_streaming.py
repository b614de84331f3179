"""Streaming packs over HTTP from a real nginx: the converged frame equals the one from disk, the
telemetry shows the network and the disk cache filling, and a server killed mid-stream costs failed
tiles (fallbacks stay on screen, the loop lives) until it is back, when the view converges again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import moderngl
import numpy as np
import pytest
from PIL import Image

from texstream.apps.render import PlaneRenderer
from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig, BudgetConfig, StreamerConfig
from texstream.pack.reader import PackReader
from texstream.remote.nginx import LocalNginx
from texstream.runtime.streamer import Streamer
from texstream.scene.camera import View
from texstream.telemetry import Telemetry, validate_frame
from texstream.testing import psnr

from ..runtime.test_streamer import CONVERGED_DB
from .conftest import fast_remote

pytestmark = pytest.mark.gl

SIZE = (256, 256)
VIEW = View(0.5, 0.5, 1.0)


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("remote-stream") / "terrain.tpk"
    bake_procedural(path, 2048, "terrain", 3, BakeConfig(jobs=1, progress=False))
    return path


@pytest.fixture
def renderer(gl_context: moderngl.Context) -> Iterator[PlaneRenderer]:
    r = PlaneRenderer(gl_context, SIZE)
    yield r
    r.release()


def config(cache: Path | None, native: bool = True, **remote: object) -> StreamerConfig:
    return StreamerConfig(
        budget=BudgetConfig(budget_mb=32),
        retry_frames=2,
        read_timeout_s=5.0,
        native=native,
        remote=fast_remote(cache, **{"request_deadline_s": 2.0, **remote}),
    )


def converge(
    s: Streamer,
    renderer: PlaneRenderer,
    vt,
    telemetry: Telemetry | None = None,  # noqa: ANN001
    seconds: float = 30.0,
) -> list[dict]:
    """Frames until nothing wanted is missing and nothing is in flight; their telemetry records."""
    records = []
    deadline = time.monotonic() + seconds
    settled = 0
    while time.monotonic() < deadline:
        if telemetry is not None:
            records.append(telemetry.update())
        else:
            s.update()
        renderer.draw(vt, VIEW)
        known = s.frame > 3 and s.last.wanted_pages > 0  # its feedback read: nothing is missing before that
        settled = settled + 1 if known and s.last.missing_pages == 0 and not s.busy else 0
        if settled >= 3:
            return records
        time.sleep(0.002)
    raise AssertionError(f"did not converge in {seconds} s: {s.stats()}")


def disk_frame(ctx: moderngl.Context, renderer: PlaneRenderer, pack: Path) -> np.ndarray:
    with Streamer(ctx, config(None)) as s:
        vt = s.open(pack)
        converge(s, renderer, vt)
        return renderer.read()


@pytest.mark.parametrize("native", [True, False], ids=["compiled-decode", "python-decode"])
def test_stream_over_http_equals_disk(
    gl_context: moderngl.Context,
    renderer: PlaneRenderer,
    nginx: LocalNginx,
    served: Path,
    pack: Path,
    cache_folder: Path,
    native: bool,
) -> None:
    shutil.copyfile(pack, served / "terrain.tpk")
    expect = disk_frame(gl_context, renderer, pack)
    with Streamer(gl_context, config(cache_folder, native)) as s:
        telemetry = Telemetry(s)
        vt = s.open(nginx.url("terrain.tpk"))
        records = converge(s, renderer, vt, telemetry)
        got = renderer.read()
        for r in records:
            validate_frame(r)
        last = records[-1]
        assert last.remote_packs == 1 and last.total_net_bytes > 0
        assert last.cache_capacity_bytes == 64 << 20
        fill = [r.cache_bytes for r in records]
        assert fill[0] < fill[-1] and fill == sorted(fill)  # the cache fills as tiles arrive
        assert max(r.net_mb_s for r in records) > 0 and last.net_latency_p95_ms > 0
        telemetry.release()
    assert psnr(got, expect) >= CONVERGED_DB
    # a second run is served by the cache: few bytes over the network, a high hit rate
    with Streamer(gl_context, config(cache_folder, native)) as s:
        telemetry = Telemetry(s)
        vt = s.open(nginx.url("terrain.tpk"))
        records = converge(s, renderer, vt, telemetry)
        assert psnr(renderer.read(), expect) >= CONVERGED_DB
        assert records[-1].cache_hit_rate > 0.9
        assert records[-1].total_net_bytes < 128 << 10  # the probe's first blocks
        telemetry.release()


def test_server_killed_mid_stream_then_back(
    gl_context: moderngl.Context, renderer: PlaneRenderer, nginx: LocalNginx, served: Path, pack: Path
) -> None:
    shutil.copyfile(pack, served / "terrain.tpk")
    expect = disk_frame(gl_context, renderer, pack)
    with Streamer(gl_context, config(None)) as s:
        vt = s.open(nginx.url("terrain.tpk"))  # pinned levels loaded: the fallback while the server is gone
        nginx.stop()
        offline_seen = False
        for _ in range(40):  # the loop stays alive and fast while every request fails
            t0 = time.perf_counter()
            s.update()
            renderer.draw(vt, VIEW)
            assert time.perf_counter() - t0 < 0.5
            offline_seen |= s.stats().net_offline
            time.sleep(0.01)
        stats = s.stats()
        assert stats.totals.failed > 0 and stats.net_failed_requests > 0 and offline_seen
        fallback = renderer.read()
        assert psnr(fallback, expect) > 15.0  # coarse levels on screen, not garbage or black
        nginx.start()
        converge(s, renderer, vt)
        assert psnr(renderer.read(), expect) >= CONVERGED_DB


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["TEXSTREAM_CACHE"] = str(cache)
    return subprocess.run(
        [sys.executable, "-m", "texstream", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_render_and_demo_from_a_url(
    nginx: LocalNginx, served: Path, pack: Path, tmp_path: Path, gl_context: object
) -> None:
    """`render` from the URL equals `render` from disk; the headless demo streams from the URL and its
    telemetry shows the network and the disk cache filling."""
    shutil.copyfile(pack, served / "terrain.tpk")
    url = nginx.url("terrain.tpk")
    images = {}
    for name, src in (("disk", str(pack)), ("url", url)):
        out = tmp_path / f"{name}.png"
        proc = _cli(
            "render",
            src,
            "--out",
            str(out),
            "--size",
            "256x256",
            "--frames",
            "60",
            "--budget-mb",
            "32",
            cache=tmp_path / "cache",
        )
        assert proc.returncode == 0, proc.stderr
        images[name] = np.asarray(Image.open(out).convert("RGB"))
    assert psnr(images["url"], images["disk"]) >= CONVERGED_DB

    frames = tmp_path / "frames"
    proc = _cli(
        "demo",
        url,
        "--headless",
        "--frames",
        "30",
        "--out",
        str(frames),
        "--size",
        "320x180",
        "--budget-mb",
        "24",
        cache=tmp_path / "cache-demo",
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (frames / "telemetry.jsonl").read_text().splitlines()]
    assert all(r["remote_packs"] == 1 and r["failed"] == 0 for r in records)
    fill = [r["cache_bytes"] for r in records]
    assert fill[-1] > fill[0] and records[-1]["total_net_bytes"] > 0
    assert (tmp_path / "cache-demo" / "remote" / "blocks.dat").exists()


def test_corrupt_byte_served_while_streaming(
    gl_context: moderngl.Context,
    renderer: PlaneRenderer,
    nginx: LocalNginx,
    served: Path,
    pack: Path,
    cache_folder: Path,
) -> None:
    """A byte flipped in one tile on the server (same size and mtime, so the same ETag): that tile
    fails its checksum and counts as corrupt, the rest of the view streams, and nothing crashes."""
    path = served / "terrain.tpk"
    shutil.copyfile(pack, path)
    with PackReader(pack) as r:
        tx, ty = (int(r.header.level_table[0][k]) // 2 for k in ("tiles_x", "tiles_y"))
        e = r.entry(0, tx, ty)  # level 0 at the centre: wanted by the view below
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(e.offset + e.stored_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x5A]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with Streamer(gl_context, config(cache_folder)) as s:
        vt = s.open(nginx.url("terrain.tpk"))
        for _ in range(80):
            s.update()
            renderer.draw(vt, VIEW)
            time.sleep(0.002)
        stats = s.stats()
        assert stats.corrupt_tiles == 1 and stats.totals.failed >= 1
        assert stats.resident_tiles > 10 and not stats.net_offline
