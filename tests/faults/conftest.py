"""A real nginx on 127.0.0.1 for the download sweep: the remote tests' fixtures, shared."""

from __future__ import annotations

from ..remote.conftest import nginx, served

__all__ = ["nginx", "served"]
