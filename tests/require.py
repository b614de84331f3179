"""Skips that CI can turn into failures: ``TEXSTREAM_REQUIRE=gl,native`` (set by `.ci/run`)."""

from __future__ import annotations

import os

import pytest

__all__ = ["skip_unless_native", "skip_unless_required"]


def skip_unless_required(requirement: str, reason: str) -> None:
    """Skip the calling test, or fail it when `requirement` is listed in TEXSTREAM_REQUIRE."""
    required = {r.strip() for r in os.environ.get("TEXSTREAM_REQUIRE", "").split(",") if r.strip()}
    if requirement in required:
        pytest.fail(f"TEXSTREAM_REQUIRE lists {requirement!r}, but {reason}", pytrace=False)
    pytest.skip(reason)


def skip_unless_native(reason: str = "texstream's compiled helper (texstream.native) is not built") -> None:
    """For tests of the compiled path, when `texstream.native.load()` returned None."""
    skip_unless_required("native", reason)
