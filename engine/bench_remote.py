"""`texstream bench stream --url`: the end-to-end pan of `bench stream` from a server against disk.

One pack (a procedural terrain, 16384^2 BC1 + zstd; quick: 4096^2) is panned at 1:1 (1024^2 frames;
quick: 512^2), a whole frame per frame, three times in one run on one headless context:

- disk: from the local file (in the page cache): the baseline;
- url, cold: from the server with an empty disk cache: every tile crosses the network;
- url, warm: again, the disk cache now holding the pack: the network only for the version probe.

Each row gives tiles/s (and the ratio to disk), the frames from a load's submission to its upload
(p50, p95), and for the URL rows the requests, bytes and request latency (p50, p95). Without a URL
argument the bench starts a local nginx (`texstream.remote.nginx`) serving the pack; with one, the
pack is read from ``URL/<name>`` and must already be there (the bench prints the file to serve).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from .config import BakeConfig, RemoteConfig
from .errors import EngineError

__all__ = ["run_remote_bench"]

LOCAL = "local"  # `--url` without a value: start a local nginx


def run_remote_bench(url: str = LOCAL, quick: bool = False, json_path: str | None = None) -> dict:
    from .bake.pipeline import bake_procedural
    from .bench_stream import end_to_end
    from .gl.context import headless_context
    from .remote.nginx import LocalNginx, find_nginx

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
            pan = (512, 512) if quick else (1024, 1024)  # 64 (quick) or 256 pan positions
            frames = 60 if quick else 200
            remote = RemoteConfig(cache_dir=str(root / "cache"))
            t0 = time.perf_counter()
            result["disk"] = end_to_end(ctx, pack, pan, frames, native=True)
            result["url_cold"] = end_to_end(ctx, pack, pan, frames, native=True, url=pack_url, remote=remote)
            result["url_warm"] = end_to_end(ctx, pack, pan, frames, native=True, url=pack_url, remote=remote)
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


def print_remote(r: dict) -> None:
    quick = " (quick)" if r["quick"] else ""
    print(f"texstream bench stream --url{quick}: {r['server']}, {r['gl_renderer']}, {r['cpu_count']} CPUs")
    d = r["disk"]
    fw, fh = d["frame_size"]
    print(f"  pan at 1:1, {fw}x{fh}, {d['frames']} frames, pack {d['pack']}")
    print(f"  {'source':<10} {'tiles/s':>10} {'x disk':>7} {'latency p50/p95':>16} {'requests':>9} {'MB':>8} "
          f"{'request ms p50/p95':>19}")  # fmt: skip
    for key, label in (("disk", "disk"), ("url_cold", "url, cold"), ("url_warm", "url, warm")):
        e = r[key]
        ratio = e["tiles_per_s"] / d["tiles_per_s"]
        net = ""
        if key != "disk":
            net = f"{e['net_requests']:>9} {e['net_bytes'] / 1e6:>8.1f} "
            net += f"{e['net_latency_ms_p50']:>8.2f} / {e['net_latency_ms_p95']:<8.2f}"
        print(f"  {label:<10} {e['tiles_per_s']:>10,.0f} {ratio:>7.2f} "
              f"{e['latency_frames_p50']:>7.0f} / {e['latency_frames_p95']:<6.0f} {net}".rstrip())  # fmt: skip
