"""Hypothesis where atheris cannot reach: hostile HTTP answers as raw bytes on a real socket, so the
status line, header parsing and chunked framing (http.client and urllib3, below the `pool` hook the
atheris `http` target uses) are in the path. Contract as for every target: the transport returns the
bytes asked for or raises its classified errors (TransientError, PermanentError, RemoteError) with a
one-line message; never another exception or a hang. The server is on 127.0.0.1 and closes each
connection after its answer, so a short body ends at once instead of waiting out a timeout."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from texstream.remote import RemoteVersion
from texstream.remote.transport import HttpTransport, PermanentError, RemoteError, TransientError

FILE = bytes(range(256)) * 4  # the "pack" the well-behaved answers serve


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    answer = b""


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(5)
        request = b""
        try:
            while b"\r\n\r\n" not in request and len(request) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    return
                request += chunk
            sock.sendall(self.server.answer)  # type: ignore[attr-defined]
        except OSError:
            pass
        finally:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


STATUS_LINES = st.sampled_from(
    [b"HTTP/1.1 206 Partial Content", b"HTTP/1.1 200 OK", b"HTTP/1.1 416 Range Not Satisfiable", b"HTTP/1.0 206 X"]
) | st.binary(max_size=40)
HEADER_NAMES = st.sampled_from(
    [b"Content-Range", b"Content-Length", b"ETag", b"Last-Modified", b"Transfer-Encoding", b"Connection", b"X-A"]
)
HEADER_VALUES = st.sampled_from(
    [b"bytes 0-15/1024", b"bytes 16-31/1024", b"16", b"chunked", b"close", b'"v1"', b"bytes */1024"]
) | st.binary(max_size=60)


@st.composite
def answers(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:  # anything at all
        return draw(st.binary(max_size=300))
    lines = [draw(STATUS_LINES)]
    lines += [
        name + b": " + value for name, value in draw(st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=6))
    ]
    body = draw(st.sampled_from([FILE[:16], FILE[16:32], b"", b"10\r\n" + FILE[:16] + b"\r\n0\r\n\r\n"]))
    body = draw(st.binary(max_size=80)) if draw(st.booleans()) else body
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _one_line(exc: BaseException) -> None:
    assert str(exc) and "\n" not in str(exc), repr(str(exc))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=answers(), fetch=st.booleans())
def test_raw_hostile_answers_are_classified(server: _Server, answer: bytes, fetch: bool) -> None:
    server.answer = answer
    host, port = server.server_address[:2]
    transport = HttpTransport(
        f"http://{host}:{port}/pack.tpk", max_requests=1, connect_timeout_s=2.0, read_timeout_s=2.0
    )
    try:
        if fetch:
            got = transport.fetch(16, 16, RemoteVersion(size=1024), deadline=float("inf"))
            assert len(got) == 16
        else:
            version, got = transport.probe(16, deadline=float("inf"))
            assert len(got) == min(16, version.size)
    except (TransientError, PermanentError, RemoteError) as exc:
        _one_line(exc)
    finally:
        transport.close()
