"""Source images named by URL, fetched once into a local file for the baker (and each cluster host).

`download(url)` probes the file's size and version (ETag / Last-Modified / fsspec info), then fetches
it in ranges of `CHUNK` bytes, each checked against that version, into a temporary file beside the
target, renamed into place when complete: ``<cache>/sources/<hash of URL and version>-<name>``. A
later call for the same version finds it there and fetches nothing. A file larger than the disk's free
space (less a margin) is refused before a byte is written; an interrupted or failed download leaves
only its temporary file, which the next download of any source removes once its writer is gone.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import xxhash

from .remote_file import _make_transport
from .transport import PackChangedError, PermanentError, RemoteError, RemoteVersion, TransientError

__all__ = ["Downloaded", "download", "sources_dir"]

log = logging.getLogger(__name__)

CHUNK = 8 << 20  # bytes a request
FREE_MARGIN = 1 << 30  # disk space left free after a download
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
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RemoteError(f"{name}: cannot create {folder}: {exc.strerror}") from None
        _remove_stale_temps(folder)
        free = shutil.disk_usage(folder).free
        if version.size > free - FREE_MARGIN:
            raise RemoteError(
                f"{name}: {version.size:,} bytes do not fit in {folder} ({free:,} bytes free, {FREE_MARGIN:,} kept)"
            )
        tmp = folder / f".{key}-{base}.{os.getpid()}.part"
        try:
            _fetch_to(transport, name, version, tmp)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        log.info("%s: downloaded %d bytes to %s", name, version.size, target)
        return Downloaded(target, name, version)
    finally:
        transport.close()


def _probe(transport: object, name: str) -> RemoteVersion:
    deadline = time.monotonic() + DEADLINE_S
    for attempt in range(ATTEMPTS):
        try:
            version, _ = transport.probe(1, deadline)  # type: ignore[attr-defined]
            return version
        except TransientError as exc:
            if attempt == ATTEMPTS - 1:
                raise RemoteError(f"{name}: {exc}") from None
            time.sleep(0.2 * (1 << attempt))
        except (PermanentError, PackChangedError) as exc:
            raise RemoteError(f"{name}: {exc}") from None
    raise AssertionError("unreachable")


def _fetch_to(transport: object, name: str, version: RemoteVersion, tmp: Path) -> None:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        for start in range(0, version.size, CHUNK):
            length = min(CHUNK, version.size - start)
            data = _range(transport, name, version, start, length)
            view = memoryview(data)
            while view:
                view = view[os.pwrite(fd, view, start + len(data) - len(view)) :]
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise RemoteError(f"{name}: the disk filled up while downloading to {tmp.parent}") from None
        raise RemoteError(f"{name}: cannot write {tmp.parent}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _range(transport: object, name: str, version: RemoteVersion, start: int, length: int) -> bytes:
    deadline = time.monotonic() + DEADLINE_S
    for attempt in range(ATTEMPTS):
        try:
            return transport.fetch(start, length, version, deadline)  # type: ignore[attr-defined]
        except TransientError as exc:
            if attempt == ATTEMPTS - 1:
                raise RemoteError(f"{name}: {exc} (at byte {start})") from None
            time.sleep(0.2 * (1 << attempt))
        except PackChangedError:
            raise RemoteError(f"{name}: the file changed on the server during the download") from None
        except PermanentError as exc:
            raise RemoteError(f"{name}: {exc}") from None
    raise AssertionError("unreachable")


def _remove_stale_temps(folder: Path) -> None:
    """Temporary files of downloads whose process is gone."""
    for part in folder.glob(".*.part"):
        try:
            pid = int(part.name.rsplit(".", 2)[-2])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            part.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
