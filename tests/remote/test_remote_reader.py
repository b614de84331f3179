"""Packs read by URL, without GL: a real nginx serving packs with range requests, a server that goes
away and comes back, a pack that changes on the server, a corrupt byte served, the disk cache's
bound and persistence, fsspec filesystems, and hostile servers (a small Python server that lies)."""

from __future__ import annotations

import http.server
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig
from texstream.errors import EngineError, PackFormatError, TileCorruptError
from texstream.pack.reader import PackReader
from texstream.remote import RemoteError, is_remote
from texstream.remote.nginx import LocalNginx

from .conftest import fast_remote as fast

BAKE = BakeConfig(tile_size=64, jobs=1, progress=False)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("remote-packs")
    out = {"a": root / "a.tpk", "b": root / "b.tpk"}
    bake_procedural(out["a"], 1024, "terrain", 1, BAKE)
    bake_procedural(out["b"], 1024, "terrain", 2, BAKE)  # same geometry, other content
    return out


def all_tiles(reader: PackReader) -> list[bytes]:
    return [reader.read_tile(*reader.tile_position(i)) for i in range(reader.header.tile_count)]


def serve(served: Path, src: Path, name: str = "p.tpk") -> Path:
    dst = served / name
    shutil.copyfile(src, dst)
    dst.chmod(0o644)
    return dst


# ---- nginx ------------------------------------------------------------------------------------------
def test_url_detection() -> None:
    assert is_remote("http://host/a.tpk") and is_remote("https://h/a") and is_remote("s3://bucket/key")
    assert not is_remote("/data/a.tpk") and not is_remote("a.tpk") and not is_remote("file:///data/a.tpk")
    assert not is_remote(Path("http://host/a.tpk"))  # a Path is a local path, whatever it looks like


def test_pack_over_http_equals_the_local_file(nginx: LocalNginx, served: Path, packs: dict, cache_folder: Path) -> None:
    serve(served, packs["a"])
    with PackReader(packs["a"]) as local, PackReader(nginx.url("p.tpk"), fast(cache_folder)) as remote:
        assert remote.header == local.header and remote.metadata == local.metadata
        assert np.array_equal(remote.index, local.index)
        assert remote.verify() == []
        first = remote.remote.stats()
        # adjacent blocks are coalesced: far fewer requests than the blocks fetched
        assert first.cache_misses > 4 and first.requests <= 3
        assert first.net_bytes == packs["a"].stat().st_size  # every byte once
        assert all_tiles(remote) == all_tiles(local)
        assert remote.remote.stats().requests == first.requests  # all from the cache now
    # a second open: one request (the version probe), every block from the disk cache
    with PackReader(nginx.url("p.tpk"), fast(cache_folder)) as again, PackReader(packs["a"]) as local:
        assert all_tiles(again) == all_tiles(local)
        s = again.remote.stats()
        assert s.requests == 1 and s.cache_misses == 0 and s.cache_hits > 0


def test_file_url_is_the_local_path(packs: dict) -> None:
    with PackReader(f"file://{packs['a']}") as r:
        assert r.remote is None and r.header.tile_count > 0


def test_cli_verbs_accept_a_url(nginx: LocalNginx, served: Path, packs: dict, tmp_path: Path) -> None:
    serve(served, packs["a"])
    env = {**os.environ, "TEXSTREAM_CACHE": str(tmp_path / "cache")}
    url = nginx.url("p.tpk")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "texstream", *args], capture_output=True, text=True, env=env, timeout=120
        )

    info = cli("info", url)
    assert info.returncode == 0 and "texstream pack v2" in info.stdout, info.stderr
    verify = cli("verify", url)
    assert verify.returncode == 0 and "all" in verify.stdout and "tiles ok" in verify.stdout, verify.stderr
    out = tmp_path / "level1.png"
    extract = cli("extract", url, str(out), "--level", "1")
    assert extract.returncode == 0 and out.stat().st_size > 0, extract.stderr
    assert (tmp_path / "cache" / "remote" / "blocks.dat").exists()  # the default cache folder
    missing = cli("info", nginx.url("nope.tpk"))
    assert missing.returncode != 0 and missing.stderr.count("\n") == 1, missing.stderr
    assert "404" in missing.stderr and "Traceback" not in missing.stderr


def test_server_gone_fails_fast_and_recovers(nginx: LocalNginx, served: Path, packs: dict) -> None:
    serve(served, packs["a"])
    with PackReader(nginx.url("p.tpk"), fast(None)) as r, PackReader(packs["a"]) as local:
        pos = r.tile_position(r.header.tile_count // 2)
        nginx.stop()
        t0 = time.monotonic()
        with pytest.raises(TileCorruptError, match="unreadable: .*(refused|Connection)"):
            r.read_tile(*pos)
        with pytest.raises(TileCorruptError):  # within the offline window: no request at all
            r.read_tile(*pos)
        assert time.monotonic() - t0 < 3.0
        assert r.remote.stats().offline
        nginx.start()
        time.sleep(0.35)  # the offline window ends; the next request probes the server again
        assert r.read_tile(*pos) == local.read_tile(*pos)
        assert not r.remote.stats().offline


def test_open_against_a_dead_server_is_one_line(nginx: LocalNginx, served: Path, packs: dict) -> None:
    serve(served, packs["a"])
    nginx.stop()
    with pytest.raises(RemoteError, match=r"^http://127\.0\.0\.1:\d+/p\.tpk: cannot connect: connection refused$"):
        PackReader(nginx.url("p.tpk"), fast(None))


def test_changed_pack_is_detected_not_mixed(nginx: LocalNginx, served: Path, packs: dict, cache_folder: Path) -> None:
    path = serve(served, packs["a"])
    cfg = fast(cache_folder)
    with PackReader(nginx.url("p.tpk"), cfg) as r:
        cached = r.tile_position(0)
        r.read_tile(*cached)
        late = r.tile_position(r.header.tile_count // 2)  # mid-file: not fetched yet
        shutil.copyfile(packs["b"], path)  # same size, other content and ETag
        os.utime(path, (time.time() + 5, time.time() + 5))
        with pytest.raises(TileCorruptError, match="changed on the server"):
            r.read_tile(*late)
        assert r.remote.changed
    # reopened: the new version, none of the old one's cached blocks
    with PackReader(nginx.url("p.tpk"), cfg) as r, PackReader(packs["b"]) as b:
        assert all_tiles(r) == all_tiles(b)


def test_corrupt_byte_served_is_detected(nginx: LocalNginx, served: Path, packs: dict, cache_folder: Path) -> None:
    path = serve(served, packs["a"])
    with PackReader(packs["a"]) as local:
        e = local.index[5]
        good = local.read_tile(*local.tile_position(5))
    st = path.stat()
    with open(path, "r+b") as f:  # flip one byte inside tile 5, keep size and mtime (so the ETag stays)
        f.seek(int(e["offset"]) + int(e["stored_size"]) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    cfg = fast(cache_folder)
    with PackReader(nginx.url("p.tpk"), cfg) as r:
        bad = r.verify()
        assert [(lv, x, y) for lv, x, y, _ in bad] == [r.tile_position(5)]
        assert "checksum" in bad[0][3] or "decode" in bad[0][3]
        assert not r.remote.changed  # the same version: a damaged byte, not a new pack
    shutil.copyfile(packs["a"], path)  # repaired, same mtime again: the same ETag
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with PackReader(nginx.url("p.tpk"), cfg) as r:  # the damaged block was not kept in the cache
        assert r.read_tile(*r.tile_position(5)) == good


def test_cache_stays_within_its_bound(nginx: LocalNginx, served: Path, packs: dict, cache_folder: Path) -> None:
    serve(served, packs["a"])
    cfg = fast(cache_folder, cache_mb=0.25, block_kb=16)  # 16 blocks for a ~700 KB pack
    with PackReader(nginx.url("p.tpk"), cfg) as r, PackReader(packs["a"]) as local:
        assert all_tiles(r) == all_tiles(local)
        assert all_tiles(r) == all_tiles(local)  # evicted blocks come back right
        s = r.remote.stats()
        assert s.cache is not None and s.cache.capacity_bytes == 256 << 10
        assert 0 < s.cache.used_bytes <= s.cache.capacity_bytes
    data = cache_folder / "blocks.dat"
    assert data.stat().st_blocks * 512 <= (256 << 10) + 8192  # on disk, not only in name


def test_cache_held_by_another_process_is_skipped(
    nginx: LocalNginx, served: Path, packs: dict, cache_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    serve(served, packs["a"])
    cache_folder.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap_hold(cache_folder / "lock")], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        with caplog.at_level(logging.WARNING), PackReader(nginx.url("p.tpk"), fast(cache_folder)) as r:
            with PackReader(packs["a"]) as local:
                assert all_tiles(r) == all_tiles(local)
            assert r.remote.stats().cache is None
        assert any("without a disk cache" in m and "in use by another process" in m for m in caplog.messages)
    finally:
        holder.kill()
        holder.wait()


def textwrap_hold(lock: Path) -> str:
    return (
        f"import fcntl, os, sys, time\nfd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n"
    )


def test_torn_cache_block_is_a_miss(nginx: LocalNginx, served: Path, packs: dict, cache_folder: Path) -> None:
    serve(served, packs["a"])
    cfg = fast(cache_folder)
    with PackReader(nginx.url("p.tpk"), cfg) as r:
        expect = all_tiles(r)
    with open(cache_folder / "blocks.dat", "r+b") as f:  # as if the process died mid-write
        f.seek(3 * cfg.block_bytes + 100)
        f.write(b"\xaa" * 64)
    with PackReader(nginx.url("p.tpk"), cfg) as r:
        assert all_tiles(r) == expect


def test_secrets_stay_out_of_messages(nginx: LocalNginx) -> None:
    with pytest.raises(RemoteError) as err:
        PackReader(f"http://user:hunter2@127.0.0.1:{nginx.port}/nope.tpk?X-Signature=s3cr3t", fast(None))
    assert "hunter2" not in str(err.value) and "s3cr3t" not in str(err.value)
    assert "nope.tpk" in str(err.value)


# ---- fsspec -------------------------------------------------------------------------------------------
def test_fsspec_memory_filesystem(packs: dict, cache_folder: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    fs.pipe("/texstream-test/a.tpk", packs["a"].read_bytes())
    try:
        with PackReader("memory://texstream-test/a.tpk", fast(cache_folder)) as r, PackReader(packs["a"]) as local:
            assert all_tiles(r) == all_tiles(local)
            # object stores give no per-request version check: a tile failing its checksum asks again
            fs.pipe("/texstream-test/a.tpk", packs["b"].read_bytes())
            assert not r.remote.check_version() and r.remote.changed
    finally:
        fs.rm("/texstream-test", recursive=True)


def test_unknown_filesystem_is_one_line() -> None:
    with pytest.raises(EngineError) as err:
        PackReader("nosuchfs://bucket/a.tpk", fast(None))
    assert "\n" not in str(err.value) and "nosuchfs" in str(err.value)


# ---- hostile servers ------------------------------------------------------------------------------------
Handler = Callable[[http.server.BaseHTTPRequestHandler], None]


@pytest.fixture
def liar() -> Iterator[Callable[[Handler], str]]:
    """A threaded HTTP server whose GET handler the test supplies; yields a function giving its URL."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(handler: Handler) -> str:
        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                try:
                    handler(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: object) -> None:
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/p.tpk"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _send(h: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes = b"") -> None:
    h.send_response(status)
    for k, v in headers.items():
        h.send_header(k, v)
    h.end_headers()
    if body:
        h.wfile.write(body)


def test_server_ignoring_ranges_is_refused_without_the_download(liar: Callable[[Handler], str]) -> None:
    sent = []

    def handler(h: http.server.BaseHTTPRequestHandler) -> None:
        _send(h, 200, {"Content-Length": str(1 << 40)})
        for _ in range(4):  # would stream a terabyte; the client must hang up instead
            h.wfile.write(b"\0" * 65536)
            sent.append(1)

    t0 = time.monotonic()
    with pytest.raises(RemoteError, match="ignores Range requests"):
        PackReader(liar(handler), fast(None))
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"Content-Range": "bytes 0-10/100"}, "answered bytes 0-10"),
        ({"Content-Range": "bytes */100"}, "bad Content-Range"),
        ({"Content-Range": "bytes 0-65535/12", "Content-Length": "65536"}, "bad Content-Range"),
    ],
)
def test_lying_content_range_is_refused(liar: Callable[[Handler], str], headers: dict, message: str) -> None:
    def handler(h: http.server.BaseHTTPRequestHandler) -> None:
        body = b"\0" * 11 if headers["Content-Range"].startswith("bytes 0-10/") else b""
        _send(h, 206, {"Content-Length": str(len(body)), **headers}, body)

    with pytest.raises(RemoteError, match=message):
        PackReader(liar(handler), fast(None))


def test_huge_claimed_size_reaches_no_huge_allocation(liar: Callable[[Handler], str], packs: dict) -> None:
    data = packs["a"].read_bytes()

    def handler(h: http.server.BaseHTTPRequestHandler) -> None:  # the real first bytes, an absurd total
        first, last = (int(v) for v in h.headers["Range"].split("=")[1].split("-"))
        part = (data + b"\0" * (last + 1))[first : last + 1]
        _send(h, 206, {"Content-Length": str(len(part)), "Content-Range": f"bytes {first}-{last}/{1 << 60}"}, part)

    with pytest.raises((PackFormatError, RemoteError)) as err:
        PackReader(liar(handler), fast(None))
    assert "\n" not in str(err.value)


def test_stalled_response_is_cut_at_the_deadline(liar: Callable[[Handler], str], packs: dict) -> None:
    data = packs["a"].read_bytes()
    calls = []

    def handler(h: http.server.BaseHTTPRequestHandler) -> None:
        first, last = (int(v) for v in h.headers["Range"].split("=")[1].split("-"))
        calls.append(first)
        part = data[first : last + 1]
        head = {"Content-Length": str(len(part)), "Content-Range": f"bytes {first}-{last}/{len(data)}", "ETag": '"v1"'}
        if len(calls) == 1:  # the probe is answered
            _send(h, 206, head, part)
            return
        _send(h, 206, head, part[:100])  # then half a body and silence
        time.sleep(30)

    t0 = time.monotonic()
    with pytest.raises((RemoteError, PackFormatError), match="(too slow|did not answer|failed|timed out)"):
        PackReader(liar(handler), fast(None, read_timeout_s=0.5, request_deadline_s=1.5, retries=1))
    assert time.monotonic() - t0 < 6
