"""Hypothesis fuzzing of the reader: only PackFormatError / TileCorruptError escape, and a tile that
reads at all reads as the tile written at that position."""

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
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict]:
    p = tmp_path_factory.mktemp("fuzz") / "base.tpk"
    tiles = make_pack(
        p,
        PackHeader(width=200, height=130, tile_size=64, supercompression=Supercompression.LZ4),
        metadata={"source": "fuzz", "n": [1, 2.5, {"k": "v"}]},
    )
    return p.read_bytes(), tiles


@pytest.fixture(scope="module")
def pristine(written: tuple[bytes, dict]) -> bytes:
    return written[0]


def _open_and_read_all(path: Path, tiles: dict | None = None) -> None:
    try:
        r = PackReader(path)
    except PackFormatError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    with r:
        assert isinstance(r.metadata, dict)
        for lv in range(r.header.level_count):
            tx, ty = r.header.tiles_in_level(lv)
            for y in range(ty):
                for x in range(tx):
                    try:
                        raw = r.read_tile(lv, x, y)
                    except TileCorruptError as exc:
                        assert str(exc) and "\n" not in str(exc)
                        continue
                    if tiles is not None:  # the checks bind data and position: what reads is right
                        assert raw == tiles.get((lv, x, y)), (lv, x, y)


@SETTINGS
@given(
    edits=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), min_size=1, max_size=12), sign=st.booleans()
)
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


_EDITS = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 7)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.integers(1, 40)),
    st.tuples(st.just("cut"), st.integers(0, 1 << 20), st.just(0)),
    st.tuples(st.just("tail"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=40)),  # near the end
)


def _apply(data: bytearray, edit: tuple) -> bytearray:
    kind, pos, arg = edit
    if not data:
        return data
    pos %= len(data)
    if kind == "set":
        data[pos] = arg
    elif kind == "flip":
        data[pos] ^= 1 << arg
    elif kind == "insert":
        data[pos:pos] = arg
    elif kind == "delete":
        del data[pos : pos + arg]
    elif kind == "cut":
        del data[pos:]
    else:  # overwrite within the last 200 bytes: the metadata and the last tiles
        at = max(0, len(data) - 1 - pos % 200)
        data[at : at + len(arg)] = arg
    return data


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(_EDITS, min_size=1, max_size=6), sign=st.booleans())
def test_mutated_anywhere(tmp_path: Path, written: tuple[bytes, dict], edits: list, sign: bool) -> None:
    """Flips, insertions, deletions and truncations anywhere in the file, metadata included."""
    pristine, tiles = written
    data = bytearray(pristine)
    for edit in edits:
        data = _apply(data, edit)
    if sign and len(data) >= 128:  # re-signing lets the mutation reach the checks behind the checksums
        data = resign(data)
    path = tmp_path / "m.tpk"
    path.write_bytes(bytes(data))
    _open_and_read_all(path, tiles)
