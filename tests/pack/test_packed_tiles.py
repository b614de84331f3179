"""Tiles laid out as one payload by the process that made them (`EncodedTiles.packed`): the writer
writes the very pack the tile-by-tile batches give, from bytes or from a buffer it was handed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from texstream.pack import PackHeader, PackWriter, Supercompression, TexelFormat, codec
from texstream.pack.writer import EncodedTiles


def _batches(h: PackHeader) -> list[EncodedTiles]:
    rng = np.random.default_rng(7)
    batches = []
    for level in range(h.level_count):
        tx, ty = h.tiles_in_level(level)
        for y0 in range(0, ty, 2):  # bands of two tile rows
            batch = EncodedTiles()
            for y in range(y0, min(ty, y0 + 2)):
                for x in range(tx):
                    raw = rng.integers(0, 3, h.tile_raw_size, np.uint8).tobytes()  # compressible: odd sizes
                    batch.add(level, x, y, *codec.encode(raw, h.supercompression))
            batches.append(batch)
    return batches[::-1]  # bands arrive in any order


@pytest.mark.parametrize("alignment", [16, 4096])
def test_packed_batches_write_the_same_pack(tmp_path: Path, alignment: int) -> None:
    h = PackHeader(
        width=500,
        height=300,
        texel_format=TexelFormat.BC1,
        tile_size=64,
        border=4,
        supercompression=Supercompression.ZSTD,
        alignment=alignment,
    )
    batches = _batches(h)
    with PackWriter(tmp_path / "lists.tpk", h) as w:
        for b in batches:
            w.add_encoded_batch(b)
    with PackWriter(tmp_path / "packed.tpk", h) as w:
        for b in batches:
            w.add_encoded_batch(b.packed(alignment))
    with PackWriter(tmp_path / "shared.tpk", h) as w:
        shared = bytearray(1 << 20)
        for b in batches:
            with memoryview(shared) as into:
                tiles = b.packed(alignment, into)
            assert tiles.outside >= 0 and tiles.payload == b""
            with pytest.raises(ValueError, match="without their payload"):
                w.add_encoded_batch(tiles)
            w.add_encoded_batch(dataclasses.replace(tiles, payload=memoryview(shared)[: tiles.outside], outside=-1))
    expected = (tmp_path / "lists.tpk").read_bytes()
    assert (tmp_path / "packed.tpk").read_bytes() == expected
    assert (tmp_path / "shared.tpk").read_bytes() == expected


def test_a_buffer_too_small_gets_the_payload_inline_and_bad_batches_are_refused(tmp_path: Path) -> None:
    h = PackHeader(width=256, height=256, texel_format=TexelFormat.BC1, tile_size=64, border=4)
    batch = _batches(h)[-1]
    with memoryview(bytearray(100)) as small:
        tiles = batch.packed(h.alignment, small)
    assert tiles.outside == -1 and len(tiles.payload) > 100
    w = PackWriter(tmp_path / "bad.tpk", h)
    with pytest.raises(ValueError, match="alignment 32"):
        w.add_encoded_batch(batch.packed(32))
    with pytest.raises(ValueError, match="packed payload is"):
        w.add_encoded_batch(dataclasses.replace(tiles, payload=tiles.payload[:-1]))
    w.abort()


def test_starting_writeback_is_only_advice(tmp_path: Path) -> None:
    """The writer asks the kernel to start writing a pack's bytes early; the call changes no byte,
    and a descriptor it cannot apply to (a pipe) is no error."""
    import os

    from texstream.pack.writer import start_writeback

    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 10000)
    fd = os.open(path, os.O_RDWR)
    try:
        assert start_writeback(fd, 0, 10000) == 10000
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 10000
    r, w = os.pipe()
    try:
        assert start_writeback(w, 0, 5) == 5
    finally:
        os.close(r)
        os.close(w)
