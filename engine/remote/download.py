"""Source images named by URL, fetched once into a local file for the baker (and each cluster host).

`download(url)` probes the file's size and version (ETag / Last-Modified / fsspec info), then fetches
it in ranges of `CHUNK` bytes, each checked against that version, into a temporary file beside the
target (the pack writer's `create_temp`), fsynced and renamed into place when complete:
``<cache>/sources/<hash of URL and version>-<name>``. A later call for the same version finds it there
and fetches nothing. A file larger than the disk's free space (less a margin) is refused before a
byte is written; a failed download removes its temporary file, and one left by a killed process is
removed by the next download of the same file.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import xxhash

from .. import _io
from ..pack.writer import create_temp, output_mode
from .remote_file import _make_transport
from .transport import PackChangedError, PermanentError, RemoteError, RemoteVersion, TransientError, Transport

__all__ = ["Downloaded", "download", "sources_dir"]

log = logging.getLogger(__name__)

CHUNK = 8 << 20  # bytes a request
FREE_MARGIN = 1 << 30  # disk space left free after a download
T = TypeVar("T")
ATTEMPTS = 3  # tries a range gets
DEADLINE_S = 60.0  # one range, its retries included


@dataclass(frozen=True)
class Downloaded:
    """A local copy of a remote file and the version it copies."""

    path: Path
    url: str  # redacted: no credentials, no query
    version: RemoteVersion


def sources_dir() -> Path:
    from ..config import cache_dir

    return cache_dir() / "sources"


def download(url: str, folder: Path | None = None, storage_options: dict | None = None) -> Downloaded:
    """The file at `url` as a local file in `folder` (default: `sources_dir()`); RemoteError, one line."""
    from ..config import RemoteConfig

    config = RemoteConfig(storage_options=storage_options or {})
    transport = _make_transport(url, config)
    name = transport.name
    try:
        version = _probe(transport, name)
        folder = folder or sources_dir()
        base = Path(urllib.parse.urlsplit(url).path).name or "source"
        key = xxhash.xxh3_64_hexdigest(f"{url}\0{version.key()}".encode())
        target = folder / f"{key}-{base}"
        if target.is_file() and target.stat().st_size == version.size:
            return Downloaded(target, name, version)
        try:
            _io.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise RemoteError(f"{name}: cannot create {folder}: {exc.strerror}") from None
        free = shutil.disk_usage(folder).free
        if version.size > free - FREE_MARGIN:
            raise RemoteError(
                f"{name}: {version.size:,} bytes do not fit in {folder} ({free:,} bytes free, {FREE_MARGIN:,} kept)"
            )
        fd, tmp = create_temp(target)  # the pack writer's: it also removes temps of dead downloads
        try:
            _fetch_to(transport, name, version, fd, target)
            try:
                # Synced before the rename: after a crash the name holds the whole file or nothing,
                # never a file of the right size whose blocks never reached the disk.
                _io.fchmod(fd, output_mode())
                _io.fsync(fd)
                os.close(fd)
                fd = -1
                _io.replace(tmp, target)
            except OSError as exc:
                raise RemoteError(f"{name}: cannot write {target}: {exc.strerror or exc}") from None
            _io.sync_folder(folder)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        log.info("%s: downloaded %d bytes to %s", name, version.size, target)
        return Downloaded(target, name, version)
    finally:
        transport.close()


def _probe(transport: Transport, name: str) -> RemoteVersion:
    version, _ = _retried(name, lambda deadline: transport.probe(1, deadline))
    return version


def _retried(name: str, request: Callable[[float], T], changed: str | None = None) -> T:
    """`request(deadline)`, tried `ATTEMPTS` times on transient errors; RemoteError (one line) else."""
    for attempt in range(ATTEMPTS):
        try:
            return request(time.monotonic() + DEADLINE_S)
        except TransientError as exc:
            if attempt == ATTEMPTS - 1:
                raise RemoteError(f"{name}: {exc}") from None
            time.sleep(0.2 * (1 << attempt))
        except PackChangedError as exc:
            raise RemoteError(f"{name}: {changed or exc}") from None
        except PermanentError as exc:
            raise RemoteError(f"{name}: {exc}") from None
    raise AssertionError("unreachable")


def _fetch_to(transport: Transport, name: str, version: RemoteVersion, fd: int, target: Path) -> None:
    changed = "the file changed on the server during the download"
    try:
        for start in range(0, version.size, CHUNK):
            length = min(CHUNK, version.size - start)
            data = _retried(name, lambda deadline, s=start, n=length: transport.fetch(s, n, version, deadline), changed)
            view = memoryview(data)
            while view:
                view = view[_io.pwrite(fd, view, start + len(data) - len(view)) :]
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise RemoteError(f"{name}: the disk filled up while downloading to {target}: {exc.strerror}") from None
        raise RemoteError(f"{name}: cannot write {target}: {exc.strerror}") from None
