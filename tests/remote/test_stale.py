"""A pack that changes on the server mid-stream is STALE, a state a program can read, and recovers
when the server serves the opened version again; a server that asks for quiet (a Retry-After past
the deadline) is OFFLINE for that long, capped, then asked again."""

from __future__ import annotations

import http.server
import time
from pathlib import Path

import numpy as np
import pytest

from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig
from texstream.errors import TileCorruptError
from texstream.pack.reader import PackReader
from texstream.remote import SourceState

from .conftest import ScriptedServer, send
from .conftest import fast_remote as fast

BAKE = BakeConfig(tile_size=64, jobs=1, progress=False)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("stale")
    bake_procedural(root / "a.tpk", 512, "terrain", 1, BAKE)
    bake_procedural(root / "b.tpk", 512, "terrain", 2, BAKE)  # same geometry, other content
    return {k: (root / f"{k}.tpk").read_bytes() for k in "ab"}


def far_tiles(reader: PackReader, count: int) -> list[tuple[int, int, int]]:
    """Tiles past the probe's first bytes, by file offset: each read needs its own request."""
    order = np.argsort(reader.index["offset"])[::-1][:count]
    assert int(reader.index["offset"][order[-1]]) > 64 << 10
    return [reader.tile_position(int(i)) for i in order]


def expected(data: bytes, tmp_path: Path, positions: list[tuple[int, int, int]]) -> list[bytes]:
    path = tmp_path / "expected.tpk"
    path.write_bytes(data)
    with PackReader(path) as r:
        return [r.read_tile(*p) for p in positions]


def test_changed_then_original_again_recovers(scripted: ScriptedServer, packs: dict, tmp_path: Path) -> None:
    scripted.files["p.tpk"] = packs["a"]
    with PackReader(scripted.url(), fast(None, stale_recheck_s=0.0)) as r:
        tiles = far_tiles(r, 3)
        want = expected(packs["a"], tmp_path, tiles)
        assert r.read_tile(*tiles[0]) == want[0]
        assert r.remote.status().state is SourceState.OK
        scripted.files["p.tpk"] = packs["b"]  # another version: another ETag
        with pytest.raises(TileCorruptError, match="changed on the server"):
            r.read_tile(*tiles[1])
        status = r.remote.status()
        assert status.state is SourceState.STALE and "changed on the server" in status.reason
        with pytest.raises(TileCorruptError, match="changed on the server"):  # still the other version
            r.read_tile(*tiles[1])
        assert r.remote.status().state is SourceState.STALE
        scripted.files["p.tpk"] = packs["a"]  # the original is back
        assert [r.read_tile(*p) for p in tiles] == want
        assert r.remote.status().state is SourceState.OK and not r.remote.changed


def test_stale_pack_asks_again_only_every_recheck_interval(scripted: ScriptedServer, packs: dict) -> None:
    scripted.files["p.tpk"] = packs["a"]
    with PackReader(scripted.url(), fast(None, stale_recheck_s=0.3)) as r:
        tiles = far_tiles(r, 4)
        scripted.files["p.tpk"] = packs["b"]
        with pytest.raises(TileCorruptError):
            r.read_tile(*tiles[0])
        asked = len(scripted.seen)
        for p in tiles[1:]:  # within the interval: failed at once, no request
            with pytest.raises(TileCorruptError, match="changed on the server"):
                r.read_tile(*p)
        assert len(scripted.seen) == asked
        scripted.files["p.tpk"] = packs["a"]
        time.sleep(0.35)
        r.read_tile(*tiles[1])  # the interval is over: one request asks, the version is back
        assert r.remote.status().state is SourceState.OK
        assert len(scripted.seen) == asked + 2  # the version check, then the tile's range


def test_long_retry_after_is_offline_for_the_cap_then_recovers(scripted: ScriptedServer, packs: dict) -> None:
    scripted.files["p.tpk"] = packs["a"]
    quiet = []

    def script(h: http.server.BaseHTTPRequestHandler, n: int) -> bool:
        if not quiet:
            return False
        quiet.clear()  # once: the next request is served
        send(h, 503, {"Retry-After": "36000", "Content-Length": "0"})
        return True

    scripted.script = script
    cfg = fast(None, retry_after_cap_s=0.3, retries=2)
    with PackReader(scripted.url(), cfg) as r:
        tiles = far_tiles(r, 2)
        quiet.append(True)
        with pytest.raises(TileCorruptError, match="retry after 36000 s"):
            r.read_tile(*tiles[0])
        status = r.remote.status()
        assert status.state is SourceState.OFFLINE and "asked to wait 36000 s" in status.reason
        asked = len(scripted.seen)
        with pytest.raises(TileCorruptError):  # within the (capped) wait: no request
            r.read_tile(*tiles[1])
        assert len(scripted.seen) == asked and r.remote.stats().offline
        time.sleep(0.35)
        r.read_tile(*tiles[1])
        assert r.remote.status().state is SourceState.OK
