"""Telling a URL from a local path: the test every reader and the baker make before opening
anything, kept apart from the transports so that a local bake imports no network code."""

from __future__ import annotations

import re

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def is_remote(path: object) -> bool:
    """Whether `path` names a pack by URL (`scheme://`, other than file://)."""
    if not isinstance(path, str):
        return False
    m = _SCHEME.match(path)
    return m is not None and m.group(1).lower() != "file"


__all__ = ["is_remote"]
