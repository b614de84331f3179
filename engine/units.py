"""Byte units, in one place: `MIB` and how texstream writes a size in messages."""

from __future__ import annotations

__all__ = ["GIB", "KIB", "MIB", "mib"]

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def mib(nbytes: float) -> str:
    """A byte count as MiB with one decimal, e.g. ``"12.5 MiB"`` (errors and log lines)."""
    return f"{nbytes / MIB:.1f} MiB"
