"""Packs read by URL: HTTP(S) range requests, or any fsspec filesystem, through an on-disk cache.

`PackReader` and `Streamer.open` accept a URL wherever they accept a path; this package does the
reading (`RemoteFile`), the byte transports (`transport`) and the cache of fetched blocks (`cache`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

# Each name -> the submodule that defines it, imported on first use (PEP 562): telling a URL from a
# path (`is_remote`, which a local bake asks) imports neither HTTP, TLS nor the block cache.
_EXPORTS = {
    ".network": ("NetworkCounters", "NetworkSummary", "RemoteStats", "summarize"),
    ".remote_file": ("RemoteFile", "SourceState", "SourceStatus", "open_remote"),
    ".transport": ("PackChangedError", "RemoteError", "RemoteVersion"),
    ".urls": ("is_remote",),
}

if TYPE_CHECKING:
    from .network import NetworkCounters, NetworkSummary, RemoteStats, summarize
    from .remote_file import RemoteFile, SourceState, SourceStatus, open_remote
    from .transport import PackChangedError, RemoteError, RemoteVersion
    from .urls import is_remote

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

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
