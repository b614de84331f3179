"""`texstream bench stream --url`: views streamed from a server against the same pack from disk.

One pack (a procedural terrain, 16384^2 BC1 + zstd; quick: 4096^2) is shown through a sequence of
camera cuts: random 1:1 and 2:1-minified views at 1024^2 (quick: 512^2), each drawn until nothing the
feedback wants is missing and no load is in flight. The same cuts run three times in one run on one
headless context:

- disk: from the local file (in the page cache): the baseline;
- url, cold: from the server with an empty disk cache: every tile crosses the network;
- url, warm: again, the disk cache now holding what the cold run fetched.

Each row gives the tiles/s delivered while converging (and the ratio to disk), the time from a cut to
a converged view (p50, p95), the frames from a load's submission to its upload (p95), and for the URL
rows the requests, bytes and request latency (p50, p95). (`bench stream`'s pan, which moves a whole
frame every frame, measures the ceiling of local reads; over a network its loads go stale before they
arrive and are cancelled, which is right for a streamer and says nothing about throughput.)

Without a URL argument the bench starts a local nginx (`texstream.remote.nginx`) serving the pack;
with one, the pack is read from ``URL/<name>`` and must already be there (the bench prints the file).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import moderngl
import numpy as np

from ..config import BakeConfig, RemoteConfig
from ..errors import EngineError

__all__ = ["run_remote_bench"]

LOCAL = "local"  # `--url` without a value: start a local nginx
CUT_TIMEOUT_S = 30.0  # a view not converged by then is counted as timed out


def run_remote_bench(url: str = LOCAL, quick: bool = False, json_path: str | None = None) -> dict:
    from ..bake.pipeline import bake_procedural
    from ..gl.context import headless_context
    from ..remote.nginx import LocalNginx, find_nginx

    result: dict = {"bench": "stream-url", "quick": quick, "cpu_count": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="texstream-bench-url-") as tmp:
        root = Path(tmp)
        served = root / "www"
        served.mkdir()
        served.chmod(0o755)
        pack = served / "terrain-bench.tpk"
        size = 4096 if quick else 16384
        bake_procedural(pack, size, "terrain", 7, BakeConfig(progress=False))
        pack.chmod(0o644)
        server = None
        if url == LOCAL:
            binary = find_nginx()
            if binary is None:
                raise EngineError("bench stream --url needs nginx to serve the pack (Debian: apt install nginx-light)")
            server = LocalNginx(binary, served, root / "nginx")
            server.start()
            pack_url = server.url(pack.name)
            result["server"] = f"local nginx on 127.0.0.1:{server.port}"
        else:
            pack_url = url.rstrip("/") + "/" + pack.name
            result["server"] = url
            print(f"serving expected: {pack} at {pack_url}")
        ctx = headless_context()
        try:
            result["gl_renderer"] = ctx.info.get("GL_RENDERER", "?")
            frame = (512, 512) if quick else (1024, 1024)
            views = _views(8 if quick else 24, seed=11)
            remote = RemoteConfig(cache_dir=str(root / "cache"))
            t0 = time.perf_counter()
            result["disk"] = converge_cuts(ctx, pack, None, None, views, frame)
            result["url_cold"] = converge_cuts(ctx, pack, pack_url, remote, views, frame)
            result["url_warm"] = converge_cuts(ctx, pack, pack_url, remote, views, frame)
            result["seconds"] = time.perf_counter() - t0
        finally:
            ctx.release()
            if server is not None:
                server.stop()
    disk = result["disk"]["tiles_per_s"]
    result["ratios"] = {k: result[k]["tiles_per_s"] / disk for k in ("url_cold", "url_warm")}
    print_remote(result)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


def _views(count: int, seed: int) -> list[tuple[float, float, float]]:
    """(cx, cy, zoom) of random cuts: 1:1 and 2:1 minified, away from the edges."""
    rng = np.random.default_rng(seed)
    return [
        (float(x), float(y), float(z))
        for x, y, z in zip(
            rng.uniform(0.1, 0.9, count), rng.uniform(0.1, 0.9, count), rng.choice([1.0, 0.5], count), strict=True
        )
    ]


def converge_cuts(
    ctx: moderngl.Context,
    pack: Path,
    url: str | None,
    remote: RemoteConfig | None,
    views: list[tuple[float, float, float]],
    size: tuple[int, int],
) -> dict:
    """Each view until converged (nothing wanted missing, nothing in flight); tiles/s and times."""
    from ..runtime.streamer import Streamer
    from ..scene.camera import View
    from .bench_pan import THROTTLE, pan_config, percentile
    from .render import PlaneRenderer

    cfg = pan_config(pack)
    if remote is not None:
        cfg = dataclasses.replace(cfg, remote=remote)
    renderer = PlaneRenderer(ctx, size)
    converge_ms, converge_frames, latencies = [], [], []
    timeouts = 0
    try:
        with Streamer(ctx, cfg) as s:
            vt = s.open(url or pack)
            throttle = s.gl.throttle(THROTTLE)
            start, net0 = s.stats().totals, s.network()
            t_all = time.perf_counter()
            for cx, cy, zoom in views:
                view = View(cx, cy, zoom)
                t0, f0 = time.perf_counter(), s.frame
                settled = 0
                while settled < 2:
                    st = s.update()
                    renderer.draw(vt, view)
                    throttle.frame_done()
                    latencies.append(st.latency_frames)
                    done = s.frame - f0 > 3 and st.missing_pages == 0 and not s.busy
                    settled = settled + 1 if done else 0
                    if time.perf_counter() - t0 > CUT_TIMEOUT_S:
                        timeouts += 1
                        break
                converge_ms.append((time.perf_counter() - t0) * 1e3)
                converge_frames.append(s.frame - f0)
            seconds = time.perf_counter() - t_all
            tiles = s.stats().totals.uploads - start.uploads
            failed = s.stats().totals.failed - start.failed
            net = s.network()
            throttle.release()
    finally:
        renderer.release()
    lat = np.concatenate(latencies) if latencies else np.zeros(1)
    return {
        "source": "url" if url else "disk",
        "frame_size": list(size),
        "cuts": len(views),
        "tiles": tiles,
        "failed": failed,
        "seconds": seconds,
        "tiles_per_s": tiles / seconds,
        "timeouts": timeouts,
        "converge_ms_p50": percentile(converge_ms, 50),
        "converge_ms_p95": percentile(converge_ms, 95),
        "converge_ms_max": max(converge_ms),
        "converge_frames_p50": percentile(converge_frames, 50),
        "latency_frames_p50": percentile(lat, 50),
        "latency_frames_p95": percentile(lat, 95),
        "net_requests": net.requests - net0.requests,
        "net_bytes": net.net_bytes - net0.net_bytes,
        "net_failed_requests": net.failed_requests - net0.failed_requests,
        "net_latency_ms_p50": net.latency_p50_ms,
        "net_latency_ms_p95": net.latency_p95_ms,
        "cache_hits": net.cache_hits - net0.cache_hits,
        "cache_misses": net.cache_misses - net0.cache_misses,
    }


def print_remote(r: dict) -> None:
    quick = " (quick)" if r["quick"] else ""
    print(f"texstream bench stream --url{quick}: {r['server']}, {r['gl_renderer']}, {r['cpu_count']} CPUs")
    d = r["disk"]
    fw, fh = d["frame_size"]
    print(f"  {d['cuts']} camera cuts at {fw}x{fh}, each drawn until converged")
    print(
        f"  {'source':<10} {'tiles/s':>9} {'x disk':>6} {'converge ms p50/p95':>20} {'latency p95':>11} "
        f"{'requests':>8} {'MB':>7} {'request ms p50/p95':>19}"
    )
    for key, label in (("disk", "disk"), ("url_cold", "url, cold"), ("url_warm", "url, warm")):
        e = r[key]
        ratio = e["tiles_per_s"] / d["tiles_per_s"]
        line = (
            f"  {label:<10} {e['tiles_per_s']:>9,.0f} {ratio:>6.2f} {e['converge_ms_p50']:>9.0f} / "
            f"{e['converge_ms_p95']:<8.0f} {e['latency_frames_p95']:>8.0f} fr"
        )
        if key != "disk":
            line += f" {e['net_requests']:>8} {e['net_bytes'] / 1e6:>7.1f} "
            if e["net_requests"]:
                line += f"{e['net_latency_ms_p50']:>8.2f} / {e['net_latency_ms_p95']:<8.2f}"
        if e["timeouts"] or e["failed"]:
            line += f"  ({e['timeouts']} cuts timed out, {e['failed']} loads failed)"
        print(line.rstrip())
