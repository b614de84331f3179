"""Transient failures of a pack's server are retried by the engine's own backoff: 503 and 429 with a
Retry-After (seconds or an HTTP date) are honoured within the request's deadline, a Retry-After past
it fails at once, connection resets and a keep-alive connection the server closed are retried, and
every retry is counted. The server is a scripted stdlib server on 127.0.0.1."""

from __future__ import annotations

import email.utils
import http.server
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig
from texstream.pack.reader import PackReader
from texstream.remote import RemoteError
from texstream.remote.transport import retry_after_seconds

from .conftest import ScriptedServer, close_without_answer, reset, send
from .conftest import fast_remote as fast


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("retries") / "p.tpk"
    bake_procedural(path, 512, "terrain", 1, BakeConfig(tile_size=64, jobs=1, progress=False))
    return path


def all_tiles(reader: PackReader) -> list[bytes]:
    return [reader.read_tile(*reader.tile_position(i)) for i in range(reader.header.tile_count)]


def local_tiles(pack: Path) -> list[bytes]:
    with PackReader(pack) as r:
        return all_tiles(r)


def unavailable(
    status: int, retry_after: Callable[[], str | None] = lambda: None
) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    """An answer of `status`, with the Retry-After `retry_after()` gives when the request arrives."""

    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        headers = {"Content-Length": "0"}
        value = retry_after()
        if value is not None:
            headers["Retry-After"] = value
        send(h, status, headers)

    return answer


def in_two_seconds() -> str:
    """An HTTP date (whole seconds, so more than one second away)."""
    return email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=2), usegmt=True)


# ---- open --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "retry_after"),
    [(503, lambda: "1"), (429, in_two_seconds), (429, lambda: None), (502, lambda: None)],
    ids=["503-seconds", "429-http-date", "429", "502"],
)
def test_unavailable_then_ok_opens(
    scripted: ScriptedServer, pack: Path, cache_folder: Path, status: int, retry_after: Callable[[], str | None]
) -> None:
    scripted.files["p.tpk"] = pack.read_bytes()
    answer = unavailable(status, retry_after)
    scripted.script = lambda h, n: n == 0 and (answer(h) or True)
    with PackReader(scripted.url(), fast(cache_folder, request_deadline_s=5.0, retries=2)) as r:
        assert all_tiles(r) == local_tiles(pack)
        s = r.remote.stats()
        assert (s.retries, s.failed_requests) == (1, 1)
    if retry_after() is not None:  # the server's wait was honoured before the second try
        assert scripted.seen[1].at - scripted.seen[0].at >= 0.9


def test_retry_after_past_the_deadline_fails_at_once(scripted: ScriptedServer, pack: Path) -> None:
    """A server asking for 10 hours of quiet: one request, one line, no 10-hour sleep."""
    scripted.files["p.tpk"] = pack.read_bytes()
    answer = unavailable(503, lambda: "36000")
    scripted.script = lambda h, n: answer(h) or True
    cfg = fast(None, request_deadline_s=2.0, retries=3)
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as err:
        PackReader(scripted.url(), cfg)
    assert time.monotonic() - t0 < cfg.request_deadline_s  # capped by the deadline: it did not wait
    assert len(scripted.seen) == 1
    message = str(err.value)
    assert "\n" not in message and "HTTP 503" in message and "retry after 36000 s, past" in message


def test_unavailable_for_good_is_one_line_after_the_retries(scripted: ScriptedServer, pack: Path) -> None:
    scripted.files["p.tpk"] = pack.read_bytes()
    answer = unavailable(503)
    scripted.script = lambda h, n: answer(h) or True
    with pytest.raises(RemoteError, match=r"^http://127\.0\.0\.1:\d+/p\.tpk: HTTP 503 Service Unavailable$"):
        PackReader(scripted.url(), fast(None, retries=2))
    assert len(scripted.seen) == 3


@pytest.mark.parametrize("hang_up", [close_without_answer, reset], ids=["closed", "reset"])
def test_closed_connection_is_retried_at_once(
    scripted: ScriptedServer,
    pack: Path,
    cache_folder: Path,
    hang_up: Callable[[http.server.BaseHTTPRequestHandler], None],
) -> None:
    """A keep-alive connection the server dropped (nginx after 75 s idle) costs one immediate retry,
    even with no retries configured: the open and a read mid-stream both go through."""
    scripted.files["p.tpk"] = pack.read_bytes()
    scripted.script = lambda h, n: n in (0, 2) and (hang_up(h) or True)
    with PackReader(scripted.url(), fast(cache_folder, retries=0, block_kb=16)) as r:
        assert all_tiles(r) == local_tiles(pack)
        s = r.remote.stats()
        assert s.retries == 2 and s.failed_requests == 2


# ---- mid-stream --------------------------------------------------------------------------------------
def test_reset_mid_body_is_retried_and_counted(scripted: ScriptedServer, pack: Path, cache_folder: Path) -> None:
    """Every range's first try is cut by a reset halfway through its body: every tile still arrives
    right, and the network counters show one retry per failed request."""
    data = pack.read_bytes()
    scripted.files["p.tpk"] = data
    cut: set[str | None] = set()

    def half_then_reset(h: http.server.BaseHTTPRequestHandler, n: int) -> bool:
        asked = h.headers.get("Range")
        if n == 0 or asked in cut:
            return False
        cut.add(asked)
        first, last = (int(v) for v in asked.split("=")[1].split("-"))
        part = data[first : last + 1]
        head = {"Content-Length": str(len(part)), "Content-Range": f"bytes {first}-{last}/{len(data)}"}
        send(h, 206, {**head, "ETag": scripted.etag("p.tpk")}, part[: len(part) // 2])
        reset(h)
        return True

    scripted.script = half_then_reset
    with PackReader(scripted.url(), fast(cache_folder, retries=2, block_kb=16, max_request_kb=64)) as r:
        assert all_tiles(r) == local_tiles(pack)
        s = r.remote.stats()
    assert len(cut) >= 3
    assert s.failed_requests == len(cut) and s.retries == len(cut)


def test_mid_stream_503s_are_retried_with_retry_after(scripted: ScriptedServer, pack: Path, cache_folder: Path) -> None:
    data = pack.read_bytes()
    scripted.files["p.tpk"] = data
    refused: set[str | None] = set()
    answer = unavailable(503, lambda: "0")

    def first_try_refused(h: http.server.BaseHTTPRequestHandler, n: int) -> bool:
        asked = h.headers.get("Range")
        if n == 0 or asked in refused:
            return False
        refused.add(asked)
        answer(h)
        return True

    scripted.script = first_try_refused
    with PackReader(scripted.url(), fast(cache_folder, retries=1, block_kb=16, max_request_kb=64)) as r:
        assert all_tiles(r) == local_tiles(pack)
        s = r.remote.stats()
    assert len(refused) >= 3 and s.retries == len(refused) and not s.offline


# ---- Retry-After parsing -----------------------------------------------------------------------------
def test_retry_after_values() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert retry_after_seconds("120", now) == 120.0
    assert retry_after_seconds(" 0 ", now) == 0.0
    assert retry_after_seconds("Fri, 02 Jan 2026 03:04:35 GMT", now) == 30.0
    assert retry_after_seconds("Thu, 01 Jan 2026 00:00:00 GMT", now) == 0.0  # in the past: now
    assert retry_after_seconds("999999999999", now) == 999999999999.0  # the caller caps it
    for junk in (None, "", "-5", "1.5", "soon", "²", "9" * 13, "x" * 200, "Fri, 32 Jan 2026 99:99:99 GMT"):
        assert retry_after_seconds(junk, now) is None, junk
