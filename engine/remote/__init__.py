"""Packs read by URL: HTTP(S) range requests, or any fsspec filesystem, through an on-disk cache.

`PackReader` and `Streamer.open` accept a URL wherever they accept a path; this package does the
reading (`RemoteFile`), the byte transports (`transport`) and the cache of fetched blocks (`cache`).
"""

from .network import NetworkCounters, NetworkSummary, RemoteStats, summarize
from .remote_file import RemoteFile, SourceState, SourceStatus, is_remote, open_remote
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
