"""Bakes whose source is a URL: downloaded once into the cache's sources folder, baked like the local
file (alone and on a Dask cluster, whose workers fetch the file themselves where they cannot see the
baking process's copy), and refused in one line when the server lies or the file would not fit."""

# ruff: noqa: F811 (the cluster tests' fixtures, imported, are parameters here)
from __future__ import annotations

import http.server
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from texstream.bake import bake_file
from texstream.bake.source import open_source
from texstream.config import BakeConfig
from texstream.errors import SourceError
from texstream.pack import TexelFormat
from texstream.remote.nginx import LocalNginx

from ..test_cluster_bake import WORKERS, address, assert_same_pack, dask_cluster, images, require_dask  # noqa: F401

SETTINGS = dict(texel_format=TexelFormat.BC3, progress=False)


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TEXSTREAM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def publish(served: Path, src: Path) -> str:
    dst = served / src.name
    shutil.copyfile(src, dst)
    dst.chmod(0o644)
    return dst.name


def test_bake_from_a_url_equals_the_local_file(
    nginx: LocalNginx, served: Path, images: dict[str, Path], tmp_path: Path, private_cache: Path
) -> None:
    url = nginx.url(publish(served, images["png"]))
    bake_file(images["png"], tmp_path / "local.tpk", BakeConfig(jobs=1, **SETTINGS))
    bake_file(url, tmp_path / "url.tpk", BakeConfig(jobs=1, **SETTINGS))
    assert_same_pack(tmp_path / "local.tpk", tmp_path / "url.tpk")
    copies = list((private_cache / "sources").iterdir())
    assert len(copies) == 1 and copies[0].read_bytes() == images["png"].read_bytes()
    mtime = copies[0].stat().st_mtime_ns
    bake_file(url, tmp_path / "again.tpk", BakeConfig(jobs=1, **SETTINGS))  # the same version: no download
    assert copies[0].stat().st_mtime_ns == mtime


def test_cluster_bake_of_a_url_equals_the_local_bake(
    address: str,
    nginx: LocalNginx,
    served: Path,
    images: dict[str, Path],
    tmp_path: Path,
) -> None:
    url = nginx.url(publish(served, images["tiff"]))
    bake_file(images["tiff"], tmp_path / "local.tpk", BakeConfig(jobs=WORKERS, **SETTINGS))
    bake_file(url, tmp_path / "cluster.tpk", BakeConfig(cluster=address, **SETTINGS))
    assert_same_pack(tmp_path / "local.tpk", tmp_path / "cluster.tpk")


def test_a_worker_without_the_file_fetches_the_same_version(
    nginx: LocalNginx, served: Path, images: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a worker on another host does: the baking process's copy is not there, so it downloads
    the URL into its own cache; a version other than the bake's is refused."""
    require_dask()
    from texstream.bake.cluster import WorkerFileSource, _open_on_worker

    url = nginx.url(publish(served, images["tiff"]))
    src = open_source(url)
    described = WorkerFileSource.of(src)
    assert described is not None and described.url == url and described.url_version
    monkeypatch.setenv("TEXSTREAM_CACHE", str(tmp_path / "other-host"))
    _open_on_worker.cache_clear()
    far = _open_on_worker(
        "/no/such/copy.tif", described.size, described.mtime_ns, src.width, src.height, url, described.url_version
    )
    np.testing.assert_array_equal(far.read_region(100, 300), src.read_region(100, 300))
    assert (tmp_path / "other-host" / "sources").is_dir()
    _open_on_worker.cache_clear()
    with pytest.raises(SourceError, match="changed on the server since the bake opened it"):
        _open_on_worker("/no/such/copy.tif", 1, 1, src.width, src.height, url, "0\0stale\0")


def test_missing_url_source_is_one_line(nginx: LocalNginx, tmp_path: Path) -> None:
    out = tmp_path / "out.tpk"
    proc = subprocess.run(
        [sys.executable, "-m", "texstream", "bake", nginx.url("nope.png"), str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "404" in proc.stderr, proc.stderr
    assert not out.exists()


@pytest.fixture
def huge_server() -> Iterator[str]:
    """A server claiming a source of 2^50 bytes (and sending zeros if asked)."""

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            first, last = (int(v) for v in self.headers["Range"].split("=")[1].split("-"))
            last = min(last, first + (1 << 20))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{1 << 50}")
            self.send_header("Content-Length", str(last - first + 1))
            self.end_headers()
            self.wfile.write(b"\0" * (last - first + 1))

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/huge.tif"
    srv.shutdown()
    srv.server_close()


def test_a_source_larger_than_the_disk_is_refused_before_writing(huge_server: str, private_cache: Path) -> None:
    with pytest.raises(SourceError, match="do not fit"):
        open_source(huge_server)
    folder = private_cache / "sources"
    assert not folder.exists() or not any(folder.iterdir())
