"""`export_ktx2`: a standard KTX2 of a pack's levels, checked against the specification's layout by
a checker written from the specification (tests/assets/ktx2_spec.py), and round-tripped."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from texstream.assets import RetileConfig, export_ktx2, read_block_file, retile_to_pack
from texstream.bake.pipeline import bake_procedural
from texstream.config import BakeConfig
from texstream.errors import EngineError
from texstream.pack.extract import extract_level
from texstream.pack.format import AddressMode, Supercompression, TexelFormat
from texstream.pack.reader import PackReader

from .files import block_levels, decode_blocks, hdr_picture, picture, write_dds
from .ktx2_spec import check_ktx2

F = TexelFormat


def all_tiles(path: Path) -> tuple[dict, list[bytes]]:
    with PackReader(path) as r:
        return r.header.describe(), [r.read_tile(*r.tile_position(i)) for i in range(r.header.tile_count)]


@pytest.mark.parametrize("scheme", ["none", "zstd"])
@pytest.mark.parametrize(
    ("fmt", "width", "height", "srgb", "mode"),
    [
        (F.BC7, 256, 256, True, AddressMode.CLAMP),
        (F.BC1, 256, 128, True, AddressMode.WRAP),
        (F.BC4, 192, 256, False, AddressMode.CLAMP),
        (F.BC5, 200, 136, False, AddressMode.WRAP),
    ],
)
def test_round_trip_pack_ktx2_pack_keeps_every_tile(
    tmp_path: Path, scheme: str, fmt: F, width: int, height: int, srgb: bool, mode: AddressMode
) -> None:
    levels = block_levels(fmt, picture(width, height, seed=2, alpha=fmt is F.BC7), 2)  # level 2 is generated
    src = write_dds(tmp_path / "a.dds", fmt, width, height, levels, srgb=srgb)
    cfg = RetileConfig(tile_size=64, border=4, address_mode=mode, supercompression=Supercompression.ZSTD)
    first = retile_to_pack(read_block_file(src), tmp_path / "a.tpk", cfg)
    report = export_ktx2(tmp_path / "a.tpk", tmp_path / "a.ktx2", supercompression=scheme)
    assert report.levels == first.header.level_count == 3

    ktx = check_ktx2((tmp_path / "a.ktx2").read_bytes())
    assert (ktx.width, ktx.height, ktx.srgb, ktx.scheme) == (width, height, srgb, 2 if scheme == "zstd" else 0)
    assert ktx.key_values["KTXwriter"].startswith(b"texstream ")
    for lv in range(2):  # the file's own levels went through untouched
        assert ktx.levels[lv] == levels[lv].tobytes()
    with PackReader(tmp_path / "a.tpk") as r:  # and every level decodes to what the pack shows
        for lv in range(3):
            w_l, h_l = r.header.level_dims(lv)
            blocks = np.frombuffer(ktx.levels[lv], np.uint8).reshape(-(-h_l // 4), -(-w_l // 4), fmt.block_bytes)
            c = fmt.channels  # extract shows BC4 as grey, BC5 with a reconstructed blue
            assert np.array_equal(decode_blocks(fmt, blocks, w_l, h_l)[..., :c], extract_level(r, lv)[..., :c])

    second = retile_to_pack(read_block_file(tmp_path / "a.ktx2"), tmp_path / "b.tpk", cfg)
    assert second.levels_copied == [0, 1, 2]
    assert all_tiles(tmp_path / "a.tpk") == all_tiles(tmp_path / "b.tpk")


def test_a_baked_pack_exports_what_it_shows(tmp_path: Path) -> None:
    """A pack from the baker (not from a block file) exports to a KTX2 whose levels decode to the
    pack's levels."""
    cfg = BakeConfig(texel_format=F.BC1, tile_size=64, jobs=1, progress=False)
    bake_procedural(tmp_path / "p.tpk", 256, "checker", 1, cfg)
    export_ktx2(tmp_path / "p.tpk", tmp_path / "p.ktx2")
    ktx = check_ktx2((tmp_path / "p.ktx2").read_bytes())
    with PackReader(tmp_path / "p.tpk") as r:
        assert len(ktx.levels) == r.header.level_count
        for lv, data in enumerate(ktx.levels):
            w_l, h_l = r.header.level_dims(lv)
            blocks = np.frombuffer(data, np.uint8).reshape(h_l // 4, w_l // 4, 8)
            assert np.array_equal(decode_blocks(F.BC1, blocks, w_l, h_l), extract_level(r, lv))


def test_odd_sizes_export_the_levels_ktx2_can_describe(tmp_path: Path) -> None:
    levels = block_levels(F.BC1, picture(203, 150), 1)
    src = write_dds(tmp_path / "o.dds", F.BC1, 203, 150, levels)
    retile_to_pack(read_block_file(src), tmp_path / "o.tpk", RetileConfig(tile_size=64))
    report = export_ktx2(tmp_path / "o.tpk", tmp_path / "o.ktx2")
    assert (report.levels, report.pack_levels) == (1, 3)  # level 1 is 102 wide in the pack, 101 in KTX2
    assert "ceil-halved" in report.summary()
    assert len(check_ktx2((tmp_path / "o.ktx2").read_bytes()).levels) == 1


def test_over_the_limit_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    levels = block_levels(F.BC7, picture(128, 128), 1)
    retile_to_pack(read_block_file(write_dds(tmp_path / "l.dds", F.BC7, 128, 128, levels)), tmp_path / "l.tpk")
    out = tmp_path / "l.ktx2"
    out.write_bytes(b"previous")
    with pytest.raises(EngineError, match="over the 1,000-byte export limit"):
        export_ktx2(tmp_path / "l.tpk", out, max_bytes=1000)
    assert out.read_bytes() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["l.dds", "l.ktx2", "l.tpk"]


def test_rgba8_packs_are_refused(tmp_path: Path) -> None:
    cfg = BakeConfig(texel_format=F.RGBA8, tile_size=64, jobs=1, progress=False)
    bake_procedural(tmp_path / "r.tpk", 64, "checker", 1, cfg)
    with pytest.raises(EngineError, match="rgba8"):
        export_ktx2(tmp_path / "r.tpk", tmp_path / "r.ktx2")
    assert not (tmp_path / "r.ktx2").exists()


def test_a_failing_write_leaves_the_previous_file_and_no_temporary(tmp_path: Path) -> None:
    """Every file operation of an export failed in turn (ENOSPC): an error naming the output (or the
    pack being read), the old file untouched, no temporary file left."""
    import errno

    from texstream.testing.faults import Fault, inject, record

    levels = block_levels(F.BC1, picture(64, 64), 1)
    retile_to_pack(read_block_file(write_dds(tmp_path / "f.dds", F.BC1, 64, 64, levels)), tmp_path / "f.tpk")
    out = tmp_path / "f.ktx2"
    with record() as log:
        export_ktx2(tmp_path / "f.tpk", out)
    kinds = frozenset({"open", "write", "chmod", "fsync", "replace"})
    done = [op.kind for op in log.operations if op.kind in kinds]
    count = done.index("replace") + 1  # after the rename only the folder's fsync is left (best effort)
    assert count >= 4
    for at in range(1, count + 1):
        out.write_bytes(b"previous")
        with pytest.raises((OSError, EngineError)) as raised, inject(Fault(at=at, errno=errno.ENOSPC, kinds=kinds)):
            export_ktx2(tmp_path / "f.tpk", out)
        named = raised.value.filename if isinstance(raised.value, OSError) else str(raised.value)
        assert str(out) in str(named) or str(tmp_path / "f.tpk") in str(named), raised.value
        assert out.read_bytes() == b"previous"
        assert sorted(os.listdir(tmp_path)) == ["f.dds", "f.ktx2", "f.tpk"], at


@pytest.mark.parametrize("scheme", ["none", "zstd"])
def test_bc6h_packs_export_with_a_float_dfd_and_round_trip(tmp_path: Path, scheme: str) -> None:
    """A BC6H pack (re-tiled from a BC6H_UF16 DDS, one level generated) exports as
    VK_FORMAT_BC6H_UFLOAT_BLOCK with a float sample (checked by the specification checker); the file's
    levels come back byte for byte, and baking the export again gives the same tiles."""
    width, height = 192, 128
    levels = block_levels(F.BC6H, hdr_picture(width, height, seed=7), 2)
    src = write_dds(tmp_path / "h.dds", F.BC6H, width, height, levels)
    cfg = RetileConfig(tile_size=64, border=4, supercompression=Supercompression.ZSTD)
    first = retile_to_pack(read_block_file(src), tmp_path / "h.tpk", cfg)
    assert first.header.texel_format is F.BC6H and first.levels_generated == [2]
    report = export_ktx2(tmp_path / "h.tpk", tmp_path / "h.ktx2", supercompression=scheme)
    assert report.levels == first.header.level_count == 3
    ktx = check_ktx2((tmp_path / "h.ktx2").read_bytes())
    assert (ktx.vk_format, ktx.srgb, ktx.width, ktx.height) == (143, False, width, height)
    for lv in range(2):
        assert ktx.levels[lv] == levels[lv].tobytes()
    with PackReader(tmp_path / "h.tpk") as r:
        w_l, h_l = r.header.level_dims(2)
        blocks = np.frombuffer(ktx.levels[2], np.uint8).reshape(-(-h_l // 4), -(-w_l // 4), 16)
        assert np.array_equal(decode_blocks(F.BC6H, blocks, w_l, h_l)[..., :3], extract_level(r, 2)[..., :3])
    second = retile_to_pack(read_block_file(tmp_path / "h.ktx2"), tmp_path / "b.tpk", cfg)
    assert second.levels_copied == [0, 1, 2]
    assert all_tiles(tmp_path / "h.tpk") == all_tiles(tmp_path / "b.tpk")


def test_the_checker_refuses_a_bc6h_dfd_without_the_float_bit(tmp_path: Path) -> None:
    """The checker is not the writer's twin: a BC6H file whose sample lacks the FLOAT qualifier or has
    the UNORM range fails it."""
    import struct

    levels = block_levels(F.BC6H, hdr_picture(64, 64), 1)
    retile_to_pack(read_block_file(write_dds(tmp_path / "c.dds", F.BC6H, 64, 64, levels)), tmp_path / "c.tpk")
    export_ktx2(tmp_path / "c.tpk", tmp_path / "c.ktx2")
    good = (tmp_path / "c.ktx2").read_bytes()
    check_ktx2(good)
    (dfd_offset,) = struct.unpack_from("<I", good, 48)
    sample = dfd_offset + 4 + 24  # the first sample, after dfdTotalSize and the 24-byte block header
    no_float = bytearray(good)
    no_float[sample + 3] &= 0x7F
    with pytest.raises(AssertionError, match="FLOAT"):
        check_ktx2(bytes(no_float))
    unorm_range = bytearray(good)
    struct.pack_into("<II", unorm_range, sample + 8, 0, 0xFFFFFFFF)
    with pytest.raises(AssertionError, match="UFLOAT sample range"):
        check_ktx2(bytes(unorm_range))
