"""Redirects from a pack's server are checked hop by hop: by default only another path on the same
origin is followed; `RedirectPolicy.SAME_SITE` also allows the host's parent or subdomains, other
ports and an http -> https upgrade; nothing ever goes from a public address to a loopback, private or
link-local one. The classification is checked as pure functions with fake resolutions; traffic goes
to 127.0.0.1 only."""

from __future__ import annotations

import http.server
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig, RedirectPolicy, RemoteConfig
from texstream.errors import TileCorruptError
from texstream.pack.reader import PackReader
from texstream.remote import RemoteError
from texstream.remote.transport import AddressScope, address_scope, redirect_refusal

from .conftest import Script, ScriptedServer, send
from .conftest import fast_remote as fast

SAME_ORIGIN, SAME_SITE, NONE = RedirectPolicy.SAME_ORIGIN, RedirectPolicy.SAME_SITE, RedirectPolicy.NONE

# ---- classification ----------------------------------------------------------------------------------
ZONE = {  # a fake DNS: no test resolves a real name
    "pack.example.com": ["93.184.216.34"],
    "example.com": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"],
    "cdn.example.com": ["151.101.1.1"],
    "internal.example.com": ["10.0.0.5"],
    "meta.example.com": ["169.254.169.254"],
    "mixed.example.com": ["151.101.1.2", "127.0.0.1"],
    "v6local.example.com": ["::ffff:127.0.0.1"],
    "nas.corp.lan": ["192.168.1.10"],
    "files.nas.corp.lan": ["192.168.1.11"],
}


class FakeResolver:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, host: str) -> list[str]:
        self.asked.append(host)
        if host in ZONE:
            return ZONE[host]
        try:
            address_scope(host)
        except ValueError:
            raise OSError(f"Name or service not known: {host}") from None
        return [host]


@pytest.mark.parametrize(
    ("address", "scope"),
    [
        ("93.184.216.34", AddressScope.PUBLIC),
        ("2001:4860:4860::8888", AddressScope.PUBLIC),
        ("127.0.0.1", AddressScope.LOOPBACK),
        ("127.0.0.2", AddressScope.LOOPBACK),
        ("::1", AddressScope.LOOPBACK),
        ("::ffff:127.0.0.1", AddressScope.LOOPBACK),
        ("10.1.2.3", AddressScope.PRIVATE),
        ("172.16.0.1", AddressScope.PRIVATE),
        ("192.168.0.1", AddressScope.PRIVATE),
        ("fd00::1", AddressScope.PRIVATE),
        ("::ffff:10.0.0.1", AddressScope.PRIVATE),
        ("169.254.169.254", AddressScope.LINK_LOCAL),
        ("fe80::1%eth0", AddressScope.LINK_LOCAL),
        ("0.0.0.0", AddressScope.RESERVED),
        ("224.0.0.1", AddressScope.RESERVED),
        ("100.64.0.1", AddressScope.RESERVED),
        ("240.0.0.1", AddressScope.RESERVED),
    ],
)
def test_address_scope(address: str, scope: AddressScope) -> None:
    assert address_scope(address) is scope


def test_address_scope_refuses_names() -> None:
    with pytest.raises(ValueError):
        address_scope("example.com")


@pytest.mark.parametrize(
    ("source", "target", "policy", "refusal"),
    [
        # the same origin: followed unless redirects are off
        ("http://pack.example.com/a.tpk", "http://pack.example.com/b/a.tpk", SAME_ORIGIN, None),
        ("http://pack.example.com/a.tpk", "http://PACK.example.com:80/b.tpk", SAME_ORIGIN, None),
        ("https://pack.example.com/a.tpk", "https://pack.example.com:443/b.tpk", SAME_SITE, None),
        ("http://pack.example.com/a.tpk", "http://pack.example.com/b.tpk", NONE, "not followed"),
        # another origin under the default
        ("http://pack.example.com/a.tpk", "https://pack.example.com/a.tpk", SAME_ORIGIN, "another scheme"),
        ("http://pack.example.com/a.tpk", "http://cdn.example.com/a.tpk", SAME_ORIGIN, "another host"),
        ("http://127.0.0.1:8000/a.tpk", "http://127.0.0.1:9000/a.tpk", SAME_ORIGIN, "another port"),
        ("http://127.0.0.1:8000/a.tpk", "http://127.0.0.2:9/a.tpk", SAME_ORIGIN, "another host"),
        ("http://pack.example.com/a.tpk", "file:///etc/passwd", SAME_SITE, "another scheme (file)"),
        ("http://pack.example.com/a.tpk", "ftp://pack.example.com/a.tpk", SAME_SITE, "another scheme (ftp)"),
        ("http://pack.example.com/a.tpk", "http:///a.tpk", SAME_SITE, "no host"),
        ("http://pack.example.com/a.tpk", "http://pack.example.com:99999/a.tpk", SAME_SITE, "does not parse"),
        # the same site
        ("http://pack.example.com/a.tpk", "https://pack.example.com/a.tpk", SAME_SITE, None),
        ("https://pack.example.com/a.tpk", "http://pack.example.com/a.tpk", SAME_SITE, "downgrade"),
        ("http://example.com/a.tpk", "http://cdn.example.com:8080/a.tpk", SAME_SITE, None),
        ("http://cdn.example.com/a.tpk", "https://example.com/a.tpk", SAME_SITE, None),
        ("http://a.github.io/a.tpk", "http://b.github.io/a.tpk", SAME_SITE, "another site"),
        ("http://example.com/a.tpk", "http://com/a.tpk", SAME_SITE, "another site"),
        ("http://pack.example.com/a.tpk", "http://evil.test/a.tpk", SAME_SITE, "another site"),
        ("http://127.0.0.1:8000/a.tpk", "http://127.0.0.1:9000/a.tpk", SAME_SITE, None),
        ("http://127.0.0.1:8000/a.tpk", "http://127.0.0.2:9/a.tpk", SAME_SITE, "another site"),
        ("http://93.184.216.34/a.tpk", "http://127.0.0.1/a.tpk", SAME_SITE, "another site"),
        # never from a public address to an inner one, even on the same site
        ("http://example.com/a.tpk", "http://internal.example.com/a.tpk", SAME_SITE, "to a private address"),
        ("http://example.com/a.tpk", "http://meta.example.com/latest/", SAME_SITE, "to a link-local address"),
        ("http://example.com/a.tpk", "http://mixed.example.com/a.tpk", SAME_SITE, "to a loopback address"),
        ("http://example.com/a.tpk", "http://v6local.example.com/a.tpk", SAME_SITE, "to a loopback address"),
        ("http://example.com/a.tpk", "http://gone.example.com/a.tpk", SAME_SITE, "cannot be checked"),
        # a private server may send its clients to another private one of its site
        ("http://nas.corp.lan/a.tpk", "http://files.nas.corp.lan/a.tpk", SAME_SITE, None),
    ],
)
def test_redirect_refusal(source: str, target: str, policy: RedirectPolicy, refusal: str | None) -> None:
    resolve = FakeResolver()
    why = redirect_refusal(source, target, policy, resolve)
    if refusal is None:
        assert why is None
    else:
        assert why is not None and refusal in why
    if urllib.parse.urlsplit(source).hostname == urllib.parse.urlsplit(target).hostname:
        assert resolve.asked == []  # the same host: nothing to resolve


def test_redirect_policy_accepts_names() -> None:
    assert RemoteConfig(redirects="same-site").redirects is SAME_SITE
    assert RemoteConfig(redirects="SAME_ORIGIN").redirects is SAME_ORIGIN
    assert RemoteConfig().redirects is SAME_ORIGIN
    with pytest.raises(ValueError, match="redirects must be one of none, same-origin, same-site"):
        RemoteConfig(redirects="anywhere")


# ---- over the wire (127.0.0.1 only) -------------------------------------------------------------------
@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("redirects") / "p.tpk"
    bake_procedural(path, 512, "terrain", 1, BakeConfig(tile_size=64, jobs=1, progress=False))
    return path


@pytest.fixture
def other(pack: Path) -> ScriptedServer:
    """A second server holding the same pack: where a hostile first one would send requests."""
    server = ScriptedServer()
    server.files["p.tpk"] = pack.read_bytes()
    yield server
    server.stop()


def redirect_to(location: str, status: int = 302) -> Script:
    def answer(h: http.server.BaseHTTPRequestHandler, n: int) -> bool:
        send(h, status, {"Location": location, "Content-Length": "0"})
        return True

    return answer


def tiles(reader: PackReader) -> list[bytes]:
    return [reader.read_tile(*reader.tile_position(i)) for i in range(reader.header.tile_count)]


def test_redirect_to_another_server_is_refused(scripted: ScriptedServer, other: ScriptedServer) -> None:
    secret = f"http://user:hunter2@127.0.0.1:{other.port}/p.tpk?X-Signature=s3cr3t"
    scripted.script = redirect_to(secret)
    with pytest.raises(RemoteError) as err:
        PackReader(scripted.url(), fast(None))
    message = str(err.value)
    assert message == (
        f"{scripted.url()}: refused a redirect to http://127.0.0.1:{other.port}/p.tpk: another port "
        "(RemoteConfig.redirects allows the same origin only)"
    )
    assert other.seen == []  # never contacted


def test_same_site_policy_follows_another_port(scripted: ScriptedServer, other: ScriptedServer, pack: Path) -> None:
    scripted.script = redirect_to(other.url(), 307)
    with PackReader(scripted.url(), fast(None, redirects="same-site")) as r, PackReader(pack) as local:
        assert tiles(r) == tiles(local)
    assert len(other.seen) >= 2 and len(other.seen) == len(scripted.seen)  # every request, hop by hop


def test_same_origin_redirect_is_followed(scripted: ScriptedServer, pack: Path) -> None:
    scripted.files["real/p.tpk"] = pack.read_bytes()
    scripted.script = lambda h, n: h.path == "/p.tpk" and redirect_to("/real/p.tpk", 301)(h, n)
    with PackReader(scripted.url(), fast(None)) as r, PackReader(pack) as local:
        assert tiles(r) == tiles(local)
    assert {s.path for s in scripted.seen} == {"/p.tpk", "/real/p.tpk"}


def test_redirects_off_refuses_even_the_same_origin(scripted: ScriptedServer, pack: Path) -> None:
    scripted.files["real/p.tpk"] = pack.read_bytes()
    scripted.script = lambda h, n: h.path == "/p.tpk" and redirect_to("/real/p.tpk")(h, n)
    with pytest.raises(RemoteError, match=r"refused a redirect to http://127\.0\.0\.1:\d+/real/p\.tpk: redirects"):
        PackReader(scripted.url(), fast(None, redirects=RedirectPolicy.NONE))
    assert len(scripted.seen) == 1


def test_redirect_loop_ends(scripted: ScriptedServer) -> None:
    scripted.script = redirect_to("/p.tpk")
    with pytest.raises(RemoteError, match="more than 5 redirects"):
        PackReader(scripted.url(), fast(None))
    assert len(scripted.seen) == 6


def test_redirect_after_the_open_fails_the_tiles_not_the_process(
    scripted: ScriptedServer, other: ScriptedServer, pack: Path
) -> None:
    """A server that starts redirecting once the pack is open: the tiles it should send fail
    (EPERM, the refused target named), nothing is fetched from the other server."""
    scripted.files["p.tpk"] = pack.read_bytes()
    armed = []
    scripted.script = lambda h, n: bool(armed) and redirect_to(other.url())(h, n)
    with PackReader(scripted.url(), fast(None)) as r:
        armed.append(True)
        far = int(np.argmax(r.index["offset"]))  # past the first request's bytes: fetched now
        assert int(r.index["offset"][far]) > 64 << 10
        with pytest.raises(TileCorruptError, match="Operation not permitted") as err:
            r.read_tile(*r.tile_position(far))
        assert f"refused a redirect to {other.url()}" in str(err.value) and "\n" not in str(err.value)
    assert other.seen == []
