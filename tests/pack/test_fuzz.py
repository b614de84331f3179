"""Hypothesis fuzzing of the header and index parser: only PackFormatError / TileCorruptError escape."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from texstream.errors import PackFormatError, TileCorruptError
from texstream.pack import PackHeader, PackReader, Supercompression

from .test_pack import make_pack, resign

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    p = tmp_path_factory.mktemp("fuzz") / "base.tpk"
    make_pack(p, PackHeader(width=200, height=130, tile_size=64, supercompression=Supercompression.LZ4))
    return p.read_bytes()


def _open_and_read_all(path: Path) -> None:
    try:
        r = PackReader(path)
    except PackFormatError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    with r:
        for lv in range(r.header.level_count):
            tx, ty = r.header.tiles_in_level(lv)
            for y in range(ty):
                for x in range(tx):
                    try:
                        r.read_tile(lv, x, y)
                    except TileCorruptError:
                        pass


@SETTINGS
@given(edits=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), min_size=1, max_size=12),
       sign=st.booleans())  # fmt: skip
def test_mutated_header_and_index(tmp_path: Path, pristine: bytes, edits: list, sign: bool) -> None:
    data = bytearray(pristine)
    for pos, val in edits:
        data[pos % len(data)] = val
    if sign:  # re-signing lets the mutation reach the field checks behind the checksums
        data = resign(data)
    path = tmp_path / "f.tpk"
    path.write_bytes(bytes(data))
    _open_and_read_all(path)


@SETTINGS
@given(blob=st.binary(max_size=600))
def test_random_bytes(tmp_path: Path, blob: bytes) -> None:
    path = tmp_path / "r.tpk"
    path.write_bytes(blob)
    _open_and_read_all(path)


@SETTINGS
@given(cut=st.integers(0, 10_000))
def test_truncation(tmp_path: Path, pristine: bytes, cut: int) -> None:
    path = tmp_path / "t.tpk"
    path.write_bytes(pristine[: cut % len(pristine)])
    _open_and_read_all(path)
