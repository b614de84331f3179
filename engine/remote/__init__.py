"""Packs read by URL: HTTP(S) range requests, or any fsspec filesystem, through an on-disk cache.

`PackReader` and `Streamer.open` accept a URL wherever they accept a path; this package does the
reading (`RemoteFile`), the byte transports (`transport`) and the cache of fetched blocks (`cache`).
"""

from .remote_file import (
    NetworkCounters,
    NetworkSummary,
    RemoteFile,
    RemoteStats,
    SourceState,
    SourceStatus,
    is_remote,
    open_remote,
    summarize,
)
from .transport import PackChangedError, RemoteError, RemoteVersion

__all__ = [
    "NetworkCounters",
    "NetworkSummary",
    "PackChangedError",
    "RemoteError",
    "RemoteFile",
    "RemoteStats",
    "RemoteVersion",
    "SourceState",
    "SourceStatus",
    "is_remote",
    "open_remote",
    "summarize",
]
