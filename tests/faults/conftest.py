"""A real nginx on 127.0.0.1 for the download sweep."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
    """nginx serving `served`; skipped (failed under TEXSTREAM_REQUIRE=nginx) without it."""
    binary = find_nginx()
    if binary is None:
        skip_unless_required("nginx", "nginx is not installed (Debian package nginx-light)")
    server = LocalNginx(binary, served, tmp_path / "nginx")
    server.start()
    try:
        yield server
    finally:
        server.stop()
