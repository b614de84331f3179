"""Pack format: round trips, validation of hostile input, atomic writes."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash

from texstream.errors import EngineError, PackFormatError, TileCorruptError
from texstream.pack import AddressMode, PackHeader, PackReader, PackWriter, Supercompression, TexelFormat
from texstream.pack.format import HEADER_SIZE, HEADER_STRUCT, INDEX_DTYPE, level_count_for


def make_pack(path: Path, header: PackHeader, seed: int = 0, metadata: dict | None = None) -> dict:
    """Write a pack of compressible pseudo-random tiles; return {(level, x, y): raw bytes}."""
    rng = np.random.default_rng(seed)
    tiles = {}
    with PackWriter(path, header, metadata or {"source": "test"}) as w:
        order = [
            (lv, x, y)
            for lv in range(header.level_count)
            for y in range(header.tiles_in_level(lv)[1])
            for x in range(header.tiles_in_level(lv)[0])
        ]
        rng.shuffle(order)  # tiles may arrive in any order
        for lv, x, y in order:
            raw = rng.integers(0, 8, header.tile_raw_size, dtype=np.uint8).tobytes()
            tiles[(lv, x, y)] = raw
            w.add_tile(lv, x, y, raw)
    return tiles


def resign(data: bytearray) -> bytearray:
    """Recompute the level-table, index and header checksums after a deliberate edit."""
    fields = list(HEADER_STRUCT.unpack(bytes(data[: HEADER_SIZE - 8])))
    levels, index_off, count = fields[9], fields[15], fields[16]
    level_bytes = bytes(data[HEADER_SIZE : HEADER_SIZE + 16 * levels])
    index_bytes = bytes(data[index_off : index_off + 24 * count])
    fields[20] = xxhash.xxh3_64_intdigest(index_bytes)
    fields[21] = xxhash.xxh3_64_intdigest(level_bytes)
    body = HEADER_STRUCT.pack(*fields)
    data[: HEADER_SIZE - 8] = body
    data[HEADER_SIZE - 8 : HEADER_SIZE] = struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
    return data


@pytest.fixture
def small_pack(tmp_path: Path) -> tuple[Path, PackHeader, dict]:
    h = PackHeader(
        width=300, height=150, tile_size=64, texel_format=TexelFormat.BC1, supercompression=Supercompression.ZSTD
    )
    p = tmp_path / "small.tpk"
    return p, h, make_pack(p, h)


@pytest.mark.parametrize("fmt", list(TexelFormat))
@pytest.mark.parametrize("sc", list(Supercompression))
def test_round_trip_every_format_and_supercompression(tmp_path: Path, fmt: TexelFormat, sc: Supercompression) -> None:
    h = PackHeader(
        width=200,
        height=90,
        tile_size=64,
        border=4,
        texel_format=fmt,
        srgb=fmt.colour,
        supercompression=sc,
        address_mode=AddressMode.WRAP,
    )
    p = tmp_path / "rt.tpk"
    tiles = make_pack(p, h, seed=int(fmt) * 3 + int(sc), metadata={"k": [1, 2]})
    with PackReader(p) as r:
        assert r.header == h
        assert r.metadata == {"k": [1, 2]}
        for (lv, x, y), raw in tiles.items():
            assert r.read_tile(lv, x, y) == raw
            e = r.entry(lv, x, y)
            assert e.offset % h.alignment == 0 and e.raw_size == h.tile_raw_size
        assert r.verify() == []


def test_level_geometry_ceil_halving() -> None:
    h = PackHeader(width=1, height=5000, tile_size=128)
    assert h.level_count == level_count_for(1, 5000, 128) == 7
    assert [h.level_dims(lv) for lv in range(h.level_count)] == [
        (1, 5000),
        (1, 2500),
        (1, 1250),
        (1, 625),
        (1, 313),
        (1, 157),
        (1, 79),
    ]
    h = PackHeader(width=4097, height=4097, tile_size=128)
    assert h.level_dims(1) == (2049, 2049) and h.tiles_in_level(0) == (33, 33)
    assert max(h.level_dims(h.level_count - 1)) <= 128 < max(h.level_dims(h.level_count - 2))
    assert PackHeader(width=1, height=1).level_count == 1


def test_tile_index_is_level_major_row_major() -> None:
    h = PackHeader(width=300, height=150, tile_size=64)
    seen = [
        h.tile_index(lv, x, y)
        for lv in range(h.level_count)
        for y in range(h.tiles_in_level(lv)[1])
        for x in range(h.tiles_in_level(lv)[0])
    ]
    assert seen == list(range(h.tile_count))
    with pytest.raises(ValueError, match="outside"):
        h.tile_index(0, 5, 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"width": 0, "height": 5}, "width"),
        ({"width": 5, "height": 5, "tile_size": 100}, "tile size"),
        ({"width": 5, "height": 5, "border": 3}, "border"),
        ({"width": 5, "height": 5, "alignment": 24}, "alignment"),
        ({"width": 5, "height": 5, "texel_format": TexelFormat.BC5, "srgb": True}, "sRGB"),
    ],
)
def test_header_rejects_bad_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PackHeader(**kwargs)


def test_corrupt_tile_detected_by_checksum(small_pack: tuple[Path, PackHeader, dict]) -> None:
    p, h, tiles = small_pack
    with PackReader(p) as r:
        e = r.entry(0, 2, 1)
    data = bytearray(p.read_bytes())
    data[e.offset + e.stored_size // 2] ^= 0x55
    p.write_bytes(data)
    with PackReader(p) as r:  # the index is intact, so the pack opens
        with pytest.raises(TileCorruptError) as info:
            r.read_tile(0, 2, 1)
        assert (info.value.level, info.value.x, info.value.y) == (0, 2, 1)
        assert r.read_tile(0, 1, 1) == tiles[(0, 1, 1)]
        bad = r.verify()
    assert [(lv, x, y) for lv, x, y, _ in bad] == [(0, 2, 1)]


def test_uncompressed_corrupt_tile(tmp_path: Path) -> None:
    h = PackHeader(width=128, height=128, tile_size=64, supercompression=Supercompression.NONE)
    p = tmp_path / "u.tpk"
    make_pack(p, h)
    with PackReader(p) as r:
        e = r.entry(0, 1, 0)
    data = bytearray(p.read_bytes())
    data[e.offset] ^= 1
    p.write_bytes(data)
    with PackReader(p) as r, pytest.raises(TileCorruptError, match="checksum"):
        r.read_tile(0, 1, 0)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d[:0], "too short"),
        (lambda d: d[:100], "too short"),
        (lambda d: b"NOTAPACK" + d[8:], "not a texstream pack; packs are made with: texstream bake"),
        (lambda d: d[:10] + b"\x07" + d[11:], "checksum"),  # header byte flipped, not re-signed
        (lambda d: d[: len(d) - 1000], "truncated"),
        (lambda d: os.urandom(4096), "not a texstream pack"),
    ],
)
def test_damaged_files_raise_pack_format_error(small_pack: tuple[Path, PackHeader, dict], edit, match: str) -> None:
    p, _, _ = small_pack
    p.write_bytes(bytes(edit(bytearray(p.read_bytes()))))
    with pytest.raises(PackFormatError, match=match):
        PackReader(p)


def _edit_header(data: bytearray, **changes: int) -> bytearray:
    names = [
        "magic",
        "version",
        "header_size",
        "flags",
        "width",
        "height",
        "fmt",
        "addr",
        "sc",
        "levels",
        "tile",
        "border",
        "align",
        "meta_size",
        "level_off",
        "index_off",
        "tile_count",
        "meta_off",
        "payload_off",
        "payload_end",
        "index_sum",
        "level_sum",
        "reserved",
    ]
    fields = list(HEADER_STRUCT.unpack(bytes(data[: HEADER_SIZE - 8])))
    for k, v in changes.items():
        fields[names.index(k)] = v
    data[: HEADER_SIZE - 8] = HEADER_STRUCT.pack(*fields)
    return resign(data)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"version": 4}, r"written by a newer texstream \(format 4; .*\): upgrade texstream"),
        ({"fmt": 6}, "texel format bc6h needs pack format 3, the header says 2"),  # a BC6H pack is version 3
        ({"version": 0}, "version 0"),
        ({"width": 1 << 24, "height": 1 << 24, "levels": 19}, "geometry|offset|count"),  # huge: no allocation
        ({"width": 0}, "width"),
        ({"levels": 200}, "level count"),
        ({"fmt": 77}, "texel format"),
        ({"sc": 9}, "supercompression"),
        ({"tile": 100}, "tile size"),
        ({"border": 6}, "border"),
        ({"align": 3}, "alignment"),
        ({"tile_count": 1 << 40}, "tile count"),
        ({"payload_end": 1 << 50}, "payload end"),
        ({"meta_size": 1 << 30}, "metadata"),
        ({"meta_off": 1 << 40}, "metadata"),
        ({"flags": 0x80}, "flag"),
    ],
)
def test_hostile_headers(small_pack: tuple[Path, PackHeader, dict], changes: dict, match: str) -> None:
    p, _, _ = small_pack
    p.write_bytes(bytes(_edit_header(bytearray(p.read_bytes()), **changes)))
    with pytest.raises(PackFormatError, match=match):
        PackReader(p)


def _edit_index(p: Path, i: int, **changes: int) -> None:
    with PackReader(p) as r:
        off = r.header.index_offset
        count = r.header.tile_count
    data = bytearray(p.read_bytes())
    index = np.frombuffer(bytes(data[off : off + count * 24]), INDEX_DTYPE).copy()
    for k, v in changes.items():
        index[i][k] = v
    data[off : off + count * 24] = index.tobytes()
    p.write_bytes(bytes(resign(data)))


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"offset": 1 << 40}, "payload end"),
        ({"offset": 64}, "before the payload|aligned"),
        ({"offset": 17}, "aligned"),
        ({"stored_size": 0xFFFFFFFF}, "bound|payload end"),
        ({"stored_size": 0}, "zero"),
        ({"raw_size": 12}, "raw size"),
    ],
)
def test_hostile_index_entries(small_pack: tuple[Path, PackHeader, dict], changes: dict, match: str) -> None:
    p, _, _ = small_pack
    _edit_index(p, 3, **changes)
    with pytest.raises(PackFormatError, match=match):
        PackReader(p)


def test_overlapping_tiles_rejected(small_pack: tuple[Path, PackHeader, dict]) -> None:
    p, _, _ = small_pack
    with PackReader(p) as r:
        e = r.entry(0, 0, 0)
    _edit_index(p, 1, offset=e.offset)
    with pytest.raises(PackFormatError, match="overlap"):
        PackReader(p)


def test_index_edit_without_resign_caught(small_pack: tuple[Path, PackHeader, dict]) -> None:
    p, h, _ = small_pack
    data = bytearray(p.read_bytes())
    data[h.index_offset + 16 + 5] ^= 0xFF  # entry 0's check: every field stays plausible
    p.write_bytes(bytes(data))
    with pytest.raises(PackFormatError, match="index checksum"):
        PackReader(p)


def test_bad_metadata(small_pack: tuple[Path, PackHeader, dict]) -> None:
    p, _, _ = small_pack
    with PackReader(p) as r:
        end = r.payload_end
    data = bytearray(p.read_bytes())
    data[end:] = b"[1,2,3]"
    _edit_header(data, meta_size=7)
    p.write_bytes(bytes(data))
    with pytest.raises(PackFormatError, match="JSON object"):
        PackReader(p)


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(PackFormatError, match="does not exist"):
        PackReader(tmp_path / "nope.tpk")
    with pytest.raises(PackFormatError, match="folder"):
        PackReader(tmp_path)


def test_writer_is_atomic_on_exception(tmp_path: Path) -> None:
    h = PackHeader(width=256, height=256, tile_size=64)
    out = tmp_path / "a.tpk"
    with pytest.raises(RuntimeError), PackWriter(out, h) as w:
        w.add_tile(0, 0, 0, bytes(h.tile_raw_size))
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_writer_keeps_previous_file_on_interrupt(tmp_path: Path) -> None:
    h = PackHeader(width=64, height=64, tile_size=64)
    out = tmp_path / "a.tpk"
    out.write_bytes(b"previous")
    with pytest.raises(KeyboardInterrupt), PackWriter(out, h):
        raise KeyboardInterrupt
    assert out.read_bytes() == b"previous" and len(list(tmp_path.iterdir())) == 1


def test_writer_refuses_incomplete_and_duplicate(tmp_path: Path) -> None:
    h = PackHeader(width=256, height=64, tile_size=64)
    w = PackWriter(tmp_path / "b.tpk", h)
    w.add_tile(0, 0, 0, bytes(h.tile_raw_size))
    with pytest.raises(ValueError, match="twice"):
        w.add_tile(0, 0, 0, bytes(h.tile_raw_size))
    with pytest.raises(ValueError, match="raw bytes"):
        w.add_tile(0, 1, 0, b"short")
    with pytest.raises(EngineError, match="incomplete"):
        w.commit()
    assert list(tmp_path.iterdir()) == []


def test_concurrent_reads(small_pack: tuple[Path, PackHeader, dict]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    p, _, tiles = small_pack
    keys = list(tiles) * 8
    with PackReader(p) as r, ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda k: r.read_tile(*k), keys))
    assert all(res == tiles[k] for k, res in zip(keys, results, strict=True))


def test_batched_adds_write_the_same_pack_as_single_adds(tmp_path: Path) -> None:
    from texstream.pack import codec
    from texstream.pack.writer import EncodedTiles

    h = PackHeader(
        width=700,
        height=300,
        texel_format=TexelFormat.BC1,
        tile_size=64,
        border=4,
        supercompression=Supercompression.ZSTD,
    )
    rng = np.random.default_rng(5)
    tiles = []
    for level in range(h.level_count):
        tx, ty = h.level_table["tiles_x"][level], h.level_table["tiles_y"][level]
        for y in range(int(ty)):
            for x in range(int(tx)):
                raw = rng.integers(0, 4, h.tile_raw_size, np.uint8).tobytes()  # compressible, odd sizes
                tiles.append((level, x, y, *codec.encode(raw, h.supercompression)))
    rng.shuffle(tiles)  # bands arrive in any order
    single, batched = tmp_path / "single.tpk", tmp_path / "batched.tpk"
    with PackWriter(single, h) as w:
        for level, x, y, stored, digest in tiles:
            w.add_encoded(level, x, y, stored, h.tile_raw_size, digest)
    with PackWriter(batched, h) as w:
        for part in (tiles[:7], tiles[7:8], tiles[8:]):
            batch = EncodedTiles()
            for level, x, y, stored, digest in part:
                batch.add(level, x, y, stored, digest)
            w.add_encoded_batch(batch)
    assert single.read_bytes() == batched.read_bytes()
    with PackReader(batched) as r:
        for level, x, y, _stored, digest in tiles[:20]:
            assert xxhash.xxh3_64_intdigest(r.read_tile(level, x, y)) == digest
    w = PackWriter(tmp_path / "bad.tpk", h)
    twice = EncodedTiles()
    twice.add(0, 1, 1, b"x", 1)
    twice.add(0, 1, 1, b"y", 2)
    with pytest.raises(ValueError, match=r"tile \(0, 1, 1\) was added twice"):
        w.add_encoded_batch(twice)
    outside = EncodedTiles()
    outside.add(0, 11, 0, b"x", 1)
    with pytest.raises(ValueError, match=r"tile \(0, 11, 0\) does not exist"):
        w.add_encoded_batch(outside)
    w.abort()


@pytest.mark.parametrize("mode", list(Supercompression))
def test_encode_many_is_encode_tile_by_tile(mode: Supercompression) -> None:
    """The bake's batched supercompression (zstd: one call for many frames) writes the bytes and
    checksums of one `encode` per tile."""
    from texstream.pack import codec

    rng = np.random.default_rng(5)
    size = 9248  # a 136² BC1 slot
    tiles = [rng.integers(0, 256, size, np.uint8).tobytes(), bytes(size), bytes(range(256)) * (size // 256) + bytes(32)]
    tiles += [np.repeat(rng.integers(0, 256, size // 8, np.uint8), 8).tobytes() for _ in range(5)]
    stored, digests = codec.encode_many(b"".join(tiles), size, mode, 3)
    assert list(zip(stored, digests, strict=True)) == [codec.encode(t, mode, 3) for t in tiles]
    one = codec.encode_many(tiles[0], size, mode, 3)
    assert one == ([codec.encode(tiles[0], mode, 3)[0]], [codec.encode(tiles[0], mode, 3)[1]])
    with pytest.raises(ValueError, match="whole tiles"):
        codec.encode_many(bytes(size + 1), size, mode)
