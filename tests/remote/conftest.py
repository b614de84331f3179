"""Fixtures of the remote-pack tests: a real nginx serving a folder, a private cache folder, and a
scripted stdlib server on 127.0.0.1 that misbehaves on cue."""

from __future__ import annotations

import hashlib
import http.server
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from texstream.config import RemoteConfig
from texstream.remote.nginx import LocalNginx, find_nginx

from ..require import skip_unless_required


@pytest.fixture
def served(tmp_path: Path) -> Path:
    """The folder nginx serves."""
    root = tmp_path / "www"
    root.mkdir()
    root.chmod(0o755)
    return root


@pytest.fixture
def nginx(served: Path, tmp_path: Path) -> Iterator[LocalNginx]:
    """nginx on 127.0.0.1 serving `served`; skipped (failed under TEXSTREAM_REQUIRE=nginx) without it."""
    binary = find_nginx()
    if binary is None:
        skip_unless_required("nginx", "nginx is not installed (Debian package nginx-light)")
    server = LocalNginx(binary, served, tmp_path / "nginx")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cache_folder(tmp_path: Path) -> Path:
    return tmp_path / "remote-cache"


def fast_remote(cache: Path | None, **overrides: object) -> RemoteConfig:
    """Short timeouts and backoff, so failures are found in a test's time; no disk cache without a folder."""
    settings: dict[str, object] = dict(
        cache_dir=str(cache) if cache else None,
        cache_mb=64 if cache else 0,
        connect_timeout_s=1.0,
        read_timeout_s=1.0,
        request_deadline_s=3.0,
        retries=1,
        backoff_s=0.02,
        offline_s=0.3,
    )
    settings.update(overrides)
    return RemoteConfig(**settings)  # type: ignore[arg-type]


# ---- a scripted server ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Seen:
    """One request the scripted server received."""

    path: str
    range: str | None
    at: float  # time.monotonic()


Script = Callable[[http.server.BaseHTTPRequestHandler, int], bool]


class ScriptedServer:
    """A stdlib HTTP/1.1 server on 127.0.0.1 serving `files` with byte ranges, a strong ETag and
    keep-alive, misbehaving as its `script` says.

    ``script(handler, n)`` runs before request n (from 0) is answered; it returns True when it dealt
    with the request itself (see the helpers below), False to have it served normally.
    """

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.seen: list[Seen] = []
        self.script: Script = lambda h, n: False
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                with server._lock:
                    n = len(server.seen)
                    server.seen.append(Seen(self.path, self.headers.get("Range"), time.monotonic()))
                try:
                    if not server.script(self, n):
                        server.serve(self)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()

    def url(self, path: str = "p.tpk") -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def etag(self, path: str) -> str:
        return '"' + hashlib.sha256(self.files[path]).hexdigest()[:16] + '"'

    def serve(self, h: http.server.BaseHTTPRequestHandler) -> None:
        """Answer as a correct server would: 206 for a satisfiable range, 404 for an unknown file."""
        path = urllib.parse.urlsplit(h.path).path.lstrip("/")
        data = self.files.get(path)
        if data is None:
            send(h, 404, {"Content-Length": "0"})
            return
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", h.headers.get("Range", ""))
        if match is None:
            send(h, 200, {"Content-Length": str(len(data)), "ETag": self.etag(path)}, data)
            return
        if_match = h.headers.get("If-Match")
        if if_match is not None and if_match != self.etag(path):
            send(h, 412, {"Content-Length": "0"})
            return
        first, last = int(match.group(1)), min(int(match.group(2)), len(data) - 1)
        part = data[first : last + 1]
        head = {"Content-Length": str(len(part)), "Content-Range": f"bytes {first}-{last}/{len(data)}"}
        send(h, 206, {**head, "ETag": self.etag(path)}, part)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def send(h: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes = b"") -> None:
    h.send_response(status)
    for k, v in headers.items():
        h.send_header(k, v)
    h.end_headers()
    if body:
        h.wfile.write(body)
    h.wfile.flush()


def close_without_answer(h: http.server.BaseHTTPRequestHandler) -> None:
    """Hang up after reading the request, as a server closing an idle keep-alive connection does
    when the request crosses the close on the wire (the client sees RemoteDisconnected)."""
    h.close_connection = True


def reset(h: http.server.BaseHTTPRequestHandler) -> None:
    """Abort the connection with a TCP reset (SO_LINGER 0), not an orderly close."""
    h.wfile.flush()
    h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    h.connection.close()
    h.close_connection = True


@pytest.fixture
def scripted() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    try:
        yield server
    finally:
        server.stop()
