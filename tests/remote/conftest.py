"""Fixtures of the remote-pack tests: a real nginx serving a folder, and a private cache folder."""

from __future__ import annotations

from collections.abc import Iterator
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
