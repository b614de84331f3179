"""Hostile and unsupported DDS/KTX2 files: one line naming the file and the problem (a SourceError),
never a traceback, a huge allocation or a hang; through the CLI, exit 1 and no output file."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
import zstandard

from texstream.apps.cli import main
from texstream.assets import read_block_file
from texstream.errors import SourceError
from texstream.pack.format import TexelFormat

from .files import block_levels, dds_bytes, ktx2_file_bytes, picture

F = TexelFormat


def refused(path: Path, data: bytes, match: str) -> str:
    path.write_bytes(data)
    with pytest.raises(SourceError) as info:
        read_block_file(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    assert match in message, message
    return message


@pytest.fixture(scope="module")
def good() -> dict[str, bytes]:
    levels = block_levels(F.BC7, picture(64, 48), 3)
    return {
        "dds": dds_bytes(F.BC7, 64, 48, levels),
        "legacy.dds": dds_bytes(F.BC1, 64, 48, block_levels(F.BC1, picture(64, 48), 2), legacy=True),
        "ktx2": ktx2_file_bytes(F.BC7, 64, 48, levels),
        "zstd.ktx2": ktx2_file_bytes(F.BC7, 64, 48, levels, zstd=True),
    }


@pytest.mark.parametrize("name", ["dds", "legacy.dds", "ktx2", "zstd.ktx2"])
def test_every_truncation_is_one_line(tmp_path: Path, good: dict[str, bytes], name: str) -> None:
    data = good[name]
    path = tmp_path / f"t.{name}"
    path.write_bytes(data)
    read_block_file(path)  # the whole file reads
    cuts = sorted({*range(0, 200), *range(200, len(data), 97), len(data) - 1})
    for n in cuts:
        path.write_bytes(data[:n])
        with pytest.raises(SourceError) as info:
            read_block_file(path)
        assert "\n" not in str(info.value) and str(path) in str(info.value)


def _dds_header(width: int, height: int, mips: int, fourcc: bytes = b"DX10", dxgi: int = 98, **kw: int) -> bytes:
    return dds_bytes(
        F.BC7, width, height, [np.zeros((1, 1, 16), np.uint8)], mip_count=mips, fourcc=fourcc, dxgi=dxgi, **kw
    )


@pytest.mark.parametrize(
    ("width", "height", "mips", "match"),
    [
        (0, 64, 1, "outside"),
        (64, 0, 1, "outside"),
        (1 << 30, 64, 1, "outside"),
        (64, 64, 100, "mip levels"),
        (64, 64, 8, "mip levels"),  # a full chain of 64 has 7
        (1 << 24, 1 << 24, 25, "truncated"),  # 2^24 squared BC7 with every mip: refused before any allocation
        (4096, 4096, 1, "truncated"),
    ],
)
def test_dds_absurd_sizes(tmp_path: Path, width: int, height: int, mips: int, match: str) -> None:
    refused(tmp_path / "a.dds", _dds_header(width, height, mips), match)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"fourcc": b"XYZW"}, "FourCC 'XYZW'"),
        ({"fourcc": b"DXT3"}, "texstream bake"),
        ({"fourcc": b"BC5S"}, "signed"),
        ({"dxgi": 2}, "DXGI format 2"),  # R32G32B32A32_FLOAT
        ({"dxgi": 96}, "BC6H_SF16 (signed half floats"),
        ({"dxgi": 94}, "BC6H_TYPELESS"),
        ({"dxgi": 81}, "BC4_SNORM"),
        ({"caps2": 0x200 | 0xFC00}, "cube maps"),
        ({"array_size": 6}, "arrays"),
    ],
)
def test_dds_unsupported_formats(tmp_path: Path, kw: dict, match: str) -> None:
    refused(tmp_path / "u.dds", _dds_header(64, 64, 1, **kw), match)


def test_dds_uncompressed_says_what_to_do(tmp_path: Path) -> None:
    data = bytearray(_dds_header(4, 4, 1))
    struct.pack_into("<I", data, 4 + 76, 0x40)  # pixel format flags: DDPF_RGB, no FourCC
    message = refused(tmp_path / "rgb.dds", bytes(data), "uncompressed")
    assert "PNG" in message and "texstream bake" in message


def test_not_a_dds(tmp_path: Path) -> None:
    refused(tmp_path / "x.dds", b"PNG\0" + b"\0" * 200, "not a DDS")


def _ktx2(vk: int = 145, scheme: int = 0, **kw: object) -> bytes:
    levels = block_levels(F.BC7, picture(16, 16), 2)
    return ktx2_file_bytes(F.BC7, 16, 16, levels, vk_format=vk, scheme=scheme, **kw)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"scheme": 1}, "Basis Universal (BasisLZ/ETC1S)"),
        ({"vk": 0, "dfd_model": 166}, "UASTC"),
        ({"vk": 0, "dfd_model": 163}, "ETC1S"),
        ({"vk": 157}, "ASTC"),
        ({"vk": 1000066000}, "ASTC"),
        ({"vk": 147}, "ETC2"),
        ({"vk": 37}, "uncompressed"),
        ({"vk": 144}, "signed BC6H"),
        ({"vk": 99999}, "unknown vkFormat"),
        ({"scheme": 9}, "supercompression scheme 9"),
        ({"faces": 6}, "cube maps"),
        ({"level_count": 40}, "mip levels"),
    ],
)
def test_ktx2_unsupported(tmp_path: Path, kw: dict, match: str) -> None:
    message = refused(tmp_path / "u.ktx2", _ktx2(**kw), match)
    if match in ("UASTC", "ETC1S", "ASTC", "ETC2", "uncompressed", "Basis Universal (BasisLZ/ETC1S)"):
        assert "texstream bake" in message


def _patch_level(
    data: bytes, level: int, offset: int | None = None, length: int | None = None, raw: int | None = None
) -> bytes:
    out = bytearray(data)
    o, n, r = struct.unpack_from("<3Q", out, 80 + 24 * level)
    struct.pack_into(
        "<3Q",
        out,
        80 + 24 * level,
        o if offset is None else offset,
        n if length is None else length,
        r if raw is None else raw,
    )
    return bytes(out)


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"offset": 1 << 62}, "truncated"),
        ({"offset": (1 << 64) - 1}, "truncated"),
        ({"length": 1 << 40}, "truncated"),
        ({"length": 0}, "truncated"),
        ({"raw": 1 << 40}, "must be"),
        ({"length": 10}, "must be"),
    ],
)
def test_ktx2_absurd_level_index(tmp_path: Path, patch: dict, match: str) -> None:
    refused(tmp_path / "l.ktx2", _patch_level(_ktx2(), 0, **patch), match)


def test_ktx2_absurd_level_count_and_size(tmp_path: Path) -> None:
    data = bytearray(_ktx2())
    struct.pack_into("<I", data, 12 + 28, 0xFFFFFFFF)  # levelCount
    refused(tmp_path / "c.ktx2", bytes(data), "mip levels")
    struct.pack_into("<3I", data, 12 + 8, 1 << 24, 1 << 24, 0)  # 2^24 x 2^24
    struct.pack_into("<I", data, 12 + 28, 25)
    refused(tmp_path / "c.ktx2", bytes(data), "truncated")


def test_ktx2_zstd_that_inflates_past_its_level_is_refused(tmp_path: Path) -> None:
    levels = block_levels(F.BC7, picture(16, 16), 1)
    data = bytearray(ktx2_file_bytes(F.BC7, 16, 16, levels, zstd=True))
    o, n, r = struct.unpack_from("<3Q", data, 80)
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (1 << 24))  # 16 MiB where 256 bytes belong
    data[o:] = bomb
    struct.pack_into("<3Q", data, 80, o, len(bomb), r)
    refused(tmp_path / "bomb.ktx2", bytes(data), "more than 256 bytes")
    data[o : o + 8] = b"garbage!"
    refused(tmp_path / "bad.ktx2", bytes(data), "does not decompress")


def test_fifo_and_folder_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "f.dds"
    os.mkfifo(fifo)
    with pytest.raises(SourceError, match="not a regular file"):
        read_block_file(fifo)
    (tmp_path / "d.ktx2").mkdir()
    with pytest.raises(SourceError, match="not a regular file"):
        read_block_file(tmp_path / "d.ktx2")


def test_cli_refuses_in_one_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "astc.ktx2"
    src.write_bytes(_ktx2(vk=157))
    out = tmp_path / "out.tpk"
    assert main(["bake", str(src), str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ASTC" in err and "texstream bake" in err
    assert sorted(os.listdir(tmp_path)) == ["astc.ktx2"]


def test_ktx2_zstd_of_an_absurd_size_is_refused_before_inflating(tmp_path: Path) -> None:
    levels = block_levels(F.BC7, picture(16, 16), 1)
    data = bytearray(ktx2_file_bytes(F.BC7, 16, 16, levels, zstd=True))
    struct.pack_into("<2I", data, 12 + 8, 1 << 20, 1 << 20)  # 2^20 squared: 2^40 bytes of BC7
    struct.pack_into("<3Q", data, 80, *struct.unpack_from("<2Q", data, 80), 1 << 40)
    refused(tmp_path / "huge.ktx2", bytes(data), "over the 4,294,967,296-byte limit")


def test_ktx2_zlib_levels_read(tmp_path: Path) -> None:
    import zlib

    levels = block_levels(F.BC1, picture(32, 32), 2)
    data = bytearray(ktx2_file_bytes(F.BC1, 32, 32, levels, scheme=3))
    body = [zlib.compress(b.tobytes()) for b in levels]
    end = 80 + 24 * 2 + 28
    data = data[:end]
    offsets = []
    for b in reversed(body):
        offsets.insert(0, len(data))
        data += b
    for lv in range(2):
        struct.pack_into("<3Q", data, 80 + 24 * lv, offsets[lv], len(body[lv]), levels[lv].nbytes)
    path = tmp_path / "z.ktx2"
    path.write_bytes(bytes(data))
    texture = read_block_file(path)
    assert [np.array_equal(a.blocks, b) for a, b in zip(texture.levels, levels, strict=True)] == [True, True]


def test_a_url_is_refused_in_one_line() -> None:
    with pytest.raises(SourceError, match="local path"):
        read_block_file("https://example.com/rock.dds")


@pytest.mark.parametrize("pixel_format", ["DXT3", "BC2", None])
def test_dds_files_pillow_writes_that_a_pack_cannot_hold(tmp_path: Path, pixel_format: str | None) -> None:
    """Pillow's BC2 (DXT3 and DX10) and uncompressed DDS files: refused with what to do."""
    from PIL import Image

    path = tmp_path / "p.dds"
    options = {"pixel_format": pixel_format} if pixel_format else {}
    Image.fromarray(picture(32, 32), "RGBA").save(path, **options)
    with pytest.raises(SourceError) as info:
        read_block_file(path)
    assert "texstream bake" in str(info.value) and "\n" not in str(info.value)


def test_a_file_no_pack_can_hold_is_refused_before_any_output(tmp_path: Path) -> None:
    """4,194,304 x 4 texels at 64-texel tiles needs 17 levels; a pack holds 16."""
    from texstream.assets import RetileConfig, retile_to_pack

    width = 64 << 16
    blocks = np.zeros((1, width // 4, 8), np.uint8)
    path = tmp_path / "wide.dds"
    path.write_bytes(dds_bytes(F.BC1, width, 4, [blocks]))
    with pytest.raises(SourceError, match="levels") as info:
        retile_to_pack(read_block_file(path), tmp_path / "wide.tpk", RetileConfig(tile_size=64))
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wide.dds"]
