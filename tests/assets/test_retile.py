"""DDS and KTX2 files re-tiled into packs: every copied level's content is the file's blocks, bit for
bit (so it decodes to exactly the file's texels); borders inside a level are the neighbours' blocks;
padding past the edge holds the clamped/wrapped texels; missing or differently sized levels are
generated and listed in the metadata."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from texstream.assets import RetileConfig, read_block_file, retile_to_pack
from texstream.bake.mips import Transfer, reduce_level
from texstream.bake.tiler import resolve
from texstream.errors import EngineError
from texstream.pack.format import AddressMode, TexelFormat
from texstream.pack.reader import PackReader
from texstream.testing import psnr

from .files import block_levels, decode_blocks, hdr_picture, picture, write_dds, write_ktx2

F = TexelFormat
T, B = 64, 8  # small tiles and a two-block border keep the bakes fast and the borders interesting


def slot_blocks(reader: PackReader, level: int, x: int, y: int) -> np.ndarray:
    h = reader.header
    s4 = h.slot_size // 4
    return np.frombuffer(reader.read_tile(level, x, y), np.uint8).reshape(s4, s4, h.texel_format.block_bytes)


def level_content_blocks(reader: PackReader, level: int) -> np.ndarray:
    """The level's blocks from its tiles' content (what the file's blocks must equal)."""
    h = reader.header
    w, hh = h.level_dims(level)
    tx, ty = h.tiles_in_level(level)
    t4, b4 = h.tile_size // 4, h.border // 4
    rows = [
        np.concatenate([slot_blocks(reader, level, x, y)[b4 : b4 + t4, b4 : b4 + t4] for x in range(tx)], axis=1)
        for y in range(ty)
    ]
    return np.concatenate(rows)[: -(-hh // 4), : -(-w // 4)]


def decoded_slot(reader: PackReader, level: int, x: int, y: int) -> np.ndarray:
    h = reader.header
    s = h.slot_size
    return decode_blocks(h.texel_format, slot_blocks(reader, level, x, y), s, s)


def check_pack(pack: Path, fmt: F, file_levels: list[np.ndarray], width: int, height: int, mode: AddressMode) -> dict:
    """The properties every re-tiled pack has; returns its metadata."""
    with PackReader(pack) as r:
        h = r.header
        assert r.verify() == []
        meta = r.metadata
        assert sorted(meta["levels_copied"] + meta["levels_generated"]) == list(range(h.level_count))
        for lv in range(h.level_count):
            w_l, h_l = h.level_dims(lv)
            tx, ty = h.tiles_in_level(lv)
            content = level_content_blocks(r, lv)
            if lv in meta["levels_copied"]:
                assert np.array_equal(content, file_levels[lv]), f"level {lv} blocks differ from the file's"
                ref = decode_blocks(fmt, file_levels[lv], w_l, h_l)
                got = decode_blocks(fmt, content, w_l, h_l)
                assert np.array_equal(got, ref)  # bit-identical: PSNR is infinite
            # Borders: in the level, the neighbour's blocks; past the edge, the address mode's texels.
            level_tex = decode_blocks(fmt, content, w_l, h_l)
            for y in range(ty):
                for x in range(tx):
                    slot = decoded_slot(r, lv, x, y)
                    rows = np.arange(y * T - B, y * T + T + B)
                    cols = np.arange(x * T - B, x * T + T + B)
                    expect = level_tex[np.ix_(resolve(rows, h_l, mode), resolve(cols, w_l, mode))]
                    wrapped_whole = mode is AddressMode.WRAP and w_l % 4 == 0 and h_l % 4 == 0
                    # texels of whole file blocks (inside the last partial block too) decode exactly
                    in_level = np.ix_((rows >= 0) & (rows < h_l), (cols >= 0) & (cols < w_l))
                    assert np.array_equal(slot[in_level], expect[in_level]), f"level {lv} tile ({x}, {y})"
                    if wrapped_whole:
                        assert np.array_equal(slot, expect), f"level {lv} tile ({x}, {y}): wrapped blocks are copies"
                    else:  # padding blocks are encoded: close to what the address mode prescribes
                        # (the texels past the edge inside the last partial block are the file's own)
                        own_r = (rows >= h_l) & (rows < 4 * -(-h_l // 4))
                        own_c = (cols >= w_l) & (cols < 4 * -(-w_l // 4))
                        keep = ~(own_r[:, None] | own_c[None, :])
                        assert psnr(slot[keep], expect[keep], ignore_alpha=False) > 30, (
                            f"level {lv} tile ({x}, {y}) padding"
                        )
    return meta


CASES = [
    # fmt, width, height, file levels (None: the full chain), address mode
    (F.BC1, 256, 256, None, AddressMode.CLAMP),
    (F.BC1, 203, 150, None, AddressMode.WRAP),
    (F.BC7, 256, 256, None, AddressMode.WRAP),
    (F.BC7, 200, 136, 2, AddressMode.CLAMP),
    (F.BC7, 131, 257, 1, AddressMode.WRAP),
    (F.BC4, 256, 192, None, AddressMode.CLAMP),
    (F.BC5, 200, 136, None, AddressMode.WRAP),
    (F.BC3, 150, 150, 2, AddressMode.CLAMP),
    (F.BC1, 5, 3, None, AddressMode.CLAMP),  # smaller than a block
    (F.BC4, 1, 1, None, AddressMode.WRAP),
    (F.BC7, 300, 2, None, AddressMode.WRAP),
]


def _expected_copied(width: int, height: int, levels: int, pack_levels: int) -> list[int]:
    out = []
    for lv in range(min(levels, pack_levels)):
        if (max(1, width >> lv), max(1, height >> lv)) != (-(-width // 2**lv), -(-height // 2**lv)):
            break
        out.append(lv)
    return out


@pytest.mark.parametrize("container", ["dds", "ktx2", "ktx2-zstd"])
@pytest.mark.parametrize(("fmt", "width", "height", "count", "mode"), CASES)
def test_retiled_pack_holds_the_files_blocks(
    tmp_path: Path, container: str, fmt: F, width: int, height: int, count: int | None, mode: AddressMode
) -> None:
    img = picture(width, height, seed=width + height, alpha=fmt in (F.BC3, F.BC7))
    n = count or max(width, height).bit_length()
    levels = block_levels(fmt, img, n)
    if container == "dds":
        src = write_dds(tmp_path / "t.dds", fmt, width, height, levels)
    else:
        src = write_ktx2(tmp_path / "t.ktx2", fmt, width, height, levels, zstd=container == "ktx2-zstd")
    texture = read_block_file(src)
    assert texture.texel_format is fmt and len(texture.levels) == n
    report = retile_to_pack(texture, tmp_path / "t.tpk", RetileConfig(tile_size=T, border=B, address_mode=mode))
    meta = check_pack(tmp_path / "t.tpk", fmt, levels, width, height, mode)
    assert meta["levels_copied"] == _expected_copied(width, height, n, report.header.level_count)
    assert meta["levels_copied"] == report.levels_copied and meta["source_format"] == texture.format_name


def test_generated_levels_use_the_bakers_filter(tmp_path: Path) -> None:
    """A one-level file: level 1 is the baker's gamma-correct box filter of the decoded level 0."""
    img = picture(256, 256, seed=3)
    levels = block_levels(F.BC7, img, 1)
    src = write_dds(tmp_path / "one.dds", F.BC7, 256, 256, levels, srgb=True)
    report = retile_to_pack(read_block_file(src), tmp_path / "one.tpk", RetileConfig(tile_size=T, border=B))
    assert report.levels_copied == [0] and report.levels_generated == [1, 2]
    decoded0 = decode_blocks(F.BC7, levels[0], 256, 256)
    expect = Transfer(srgb=True).encode(reduce_level(np.ascontiguousarray(decoded0), Transfer(srgb=True)))
    with PackReader(tmp_path / "one.tpk") as r:
        assert r.header.srgb
        got = decode_blocks(F.BC7, level_content_blocks(r, 1), 128, 128)
    assert psnr(got, expect, ignore_alpha=False) > 38
    assert (
        psnr(got, decode_blocks(F.BC7, block_levels(F.BC7, img, 2)[1], 128, 128), ignore_alpha=False) > 25
    )  # a mip of the same image


@pytest.mark.parametrize(
    ("pixel_format", "fmt", "mode"),
    [("DXT1", F.BC1, "RGB"), ("DXT5", F.BC3, "RGBA"), ("BC3", F.BC3, "RGBA"), ("BC5", F.BC5, "RGB")],
)
def test_dds_written_by_pillow(tmp_path: Path, pixel_format: str, fmt: F, mode: str) -> None:
    """Pillow writes the DDS and decodes it: the pack's level 0 decodes to exactly Pillow's texels."""
    img = picture(200, 136, seed=5, alpha=mode == "RGBA")
    src = tmp_path / "pillow.dds"
    Image.fromarray(img[..., : len(mode)], mode).save(src, pixel_format=pixel_format)
    texture = read_block_file(src)
    assert texture.texel_format is fmt
    retile_to_pack(texture, tmp_path / "p.tpk", RetileConfig(tile_size=T, border=B))
    with Image.open(src) as im:
        ref = np.asarray(im.convert("RGBA"))
    with PackReader(tmp_path / "p.tpk") as r:
        assert r.metadata["levels_copied"][0] == 0
        got = decode_blocks(fmt, level_content_blocks(r, 0), 200, 136)
    if fmt is F.BC5:  # Pillow decodes BC5 to (r, g, b) with b reconstructed; the pack stores r, g
        got, ref = got[..., :2], ref[..., :2]
    elif fmt is F.BC1:
        got, ref = got[..., :3], ref[..., :3]
    assert np.array_equal(got, ref)


def test_pillow_reads_the_same_texels_from_a_dx10_bc7_file(tmp_path: Path) -> None:
    img = picture(128, 96, seed=9, alpha=True)
    levels = block_levels(F.BC7, img, 3)
    src = write_dds(tmp_path / "b7.dds", F.BC7, 128, 96, levels, srgb=True)
    retile_to_pack(read_block_file(src), tmp_path / "b7.tpk", RetileConfig(tile_size=T, border=B))
    with Image.open(io.BytesIO(src.read_bytes())) as im:
        ref = np.asarray(im.convert("RGBA"))
    with PackReader(tmp_path / "b7.tpk") as r:
        got = decode_blocks(F.BC7, level_content_blocks(r, 0), 128, 96)
    assert np.array_equal(got, ref)


def test_legacy_dds_colour_is_srgb_unless_told_linear(tmp_path: Path) -> None:
    levels = block_levels(F.BC1, picture(64, 64), 1)
    src = write_dds(tmp_path / "l.dds", F.BC1, 64, 64, levels, legacy=True)
    assert read_block_file(src).srgb is None
    a = retile_to_pack(read_block_file(src), tmp_path / "a.tpk", RetileConfig(tile_size=T))
    b = retile_to_pack(read_block_file(src), tmp_path / "b.tpk", RetileConfig(tile_size=T, srgb=False))
    assert a.header.srgb and not b.header.srgb


def test_a_format_that_contradicts_the_file_is_refused(tmp_path: Path) -> None:
    levels = block_levels(F.BC7, picture(64, 64), 1)
    src = write_ktx2(tmp_path / "s.ktx2", F.BC7, 64, 64, levels, srgb=True)
    with pytest.raises(ValueError, match="sRGB"):
        retile_to_pack(read_block_file(src), tmp_path / "s.tpk", RetileConfig(tile_size=T, srgb=False))
    assert not (tmp_path / "s.tpk").exists()


def test_encoder_threads_do_not_change_the_pack(tmp_path: Path) -> None:
    """Padding blocks and generated levels are encoded in fixed runs of blocks, whatever the threads."""
    levels = block_levels(F.BC7, picture(1031, 517, alpha=True), 1)
    src = write_dds(tmp_path / "o.dds", F.BC7, 1031, 517, levels)
    tiles = []
    for jobs in (1, 3):
        out = tmp_path / f"j{jobs}.tpk"
        cfg = RetileConfig(tile_size=T, border=B, address_mode=AddressMode.WRAP, jobs=jobs, bc7_quality="fast")
        report = retile_to_pack(read_block_file(src), out, cfg)
        assert report.levels_generated[0] == 1  # 516 x 259: 8,385 blocks, three encoder calls
        with PackReader(out) as r:
            tiles.append([r.read_tile(*r.tile_position(i)) for i in range(r.header.tile_count)])
    assert tiles[0] == tiles[1]


def test_a_level_that_matches_again_after_a_generated_one_is_copied(tmp_path: Path) -> None:
    """1024 x 3: level 1 is 512 x 1 in the file and 512 x 2 in the pack (generated), level 2 is
    256 x 1 in both (copied)."""
    levels = block_levels(F.BC1, picture(1024, 3), 11)
    src = write_dds(tmp_path / "thin.dds", F.BC1, 1024, 3, levels)
    report = retile_to_pack(read_block_file(src), tmp_path / "thin.tpk", RetileConfig(tile_size=T, border=B))
    assert report.levels_generated[0] == 1 and 2 in report.levels_copied
    check_pack(tmp_path / "thin.tpk", F.BC1, levels, 1024, 3, AddressMode.CLAMP)


def test_a_failed_write_leaves_no_pack_and_no_temporary(tmp_path: Path) -> None:
    import errno
    import os

    from texstream.testing.faults import Fault, inject

    levels = block_levels(F.BC1, picture(256, 256), 9)
    src = write_dds(tmp_path / "w.dds", F.BC1, 256, 256, levels)
    texture = read_block_file(src)
    faults = inject(Fault(at=2, errno=errno.ENOSPC, kinds=frozenset({"write", "fsync"})))
    with pytest.raises(EngineError, match=f"cannot write {tmp_path / 'w.tpk'}: No space left on device"), faults:
        retile_to_pack(texture, tmp_path / "w.tpk", RetileConfig(tile_size=T, border=B))
    assert sorted(os.listdir(tmp_path)) == ["w.dds"]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"tile_size": 100}, "tile size"),
        ({"border": 3}, "border"),
        ({"bc7_quality": "best"}, "bc7 quality"),
        ({"zstd_level": 0}, "zstd level"),
        ({"jobs": -1}, "jobs"),
    ],
)
def test_retile_config_is_checked_when_made(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RetileConfig(**kw)


# ---- BC6H (unsigned half-float HDR) files -----------------------------------------------------------
BC6H_CASES = [
    # width, height, file levels (None: the full chain), address mode
    (256, 192, None, AddressMode.CLAMP),
    (150, 100, 2, AddressMode.WRAP),
    (128, 128, 1, AddressMode.WRAP),
]


@pytest.mark.parametrize("container", ["dds", "ktx2", "ktx2-zstd"])
@pytest.mark.parametrize(("width", "height", "count", "mode"), BC6H_CASES)
def test_bc6h_files_retile_without_reencoding(
    tmp_path: Path, container: str, width: int, height: int, count: int | None, mode: AddressMode
) -> None:
    """BC6H_UF16 DDS and BC6H_UFLOAT KTX2: every copied level is the file's blocks (texture2ddecoder
    decodes them to the same texels: PSNR = inf), padding holds the address mode's texels."""
    img = hdr_picture(width, height, seed=width)
    n = count or max(width, height).bit_length()
    levels = block_levels(F.BC6H, img, n)
    if container == "dds":
        src = write_dds(tmp_path / "h.dds", F.BC6H, width, height, levels)
    else:
        src = write_ktx2(tmp_path / "h.ktx2", F.BC6H, width, height, levels, zstd=container == "ktx2-zstd")
    texture = read_block_file(src)
    assert texture.texel_format is F.BC6H and texture.srgb is False and len(texture.levels) == n
    report = retile_to_pack(texture, tmp_path / "h.tpk", RetileConfig(tile_size=T, border=B, address_mode=mode))
    assert report.header.texel_format is F.BC6H and not report.header.srgb
    meta = check_pack(tmp_path / "h.tpk", F.BC6H, levels, width, height, mode)
    assert meta["levels_copied"] == _expected_copied(width, height, n, report.header.level_count)
    assert meta["source_format"] == texture.format_name


def test_bc6h_missing_levels_are_generated_in_linear_float(tmp_path: Path) -> None:
    """A one-level BC6H file with highlights far above 1: the generated levels are box means of the
    file's float texels, not of 8-bit or clamped ones. The reference is the float mean of the
    picture itself; the pack's blocks are read with bcdec's float decoder (imagecodecs) and, for
    the range in [0, 1], with texture2ddecoder."""
    import imagecodecs

    img = hdr_picture(256, 256, seed=4)
    assert img[..., :3].max() > 4  # highlights: an 8-bit or clamped path would flatten them
    src = write_ktx2(tmp_path / "one.ktx2", F.BC6H, 256, 256, block_levels(F.BC6H, img, 1))
    report = retile_to_pack(read_block_file(src), tmp_path / "one.tpk", RetileConfig(tile_size=T, border=B))
    assert report.levels_copied == [0] and report.levels_generated == [1, 2]
    with PackReader(tmp_path / "one.tpk") as r:
        for lv, k in ((1, 2), (2, 4)):
            w, h = r.header.level_dims(lv)
            blocks = level_content_blocks(r, lv)
            expect = block_mean(img, k)[..., :3]
            got = imagecodecs.bcn_decode(blocks.tobytes(), 6, shape=(h, w, 3)).astype(np.float32)
            assert got.max() > 0.8 * expect.max() > 2  # the highlight is still far above 1
            assert psnr(got, expect, peak=float(expect.max())) > 35, f"level {lv}"
            got8 = decode_blocks(F.BC6H, blocks, w, h)[..., :3].astype(np.float32)
            assert psnr(got8, np.clip(expect, 0, 1) * 255) > 30, f"level {lv} (texture2ddecoder)"


def block_mean(img: np.ndarray, k: int) -> np.ndarray:
    h, w = img.shape[:2]
    return img.reshape(h // k, k, w // k, k, -1).mean(axis=(1, 3))


def test_signed_bc6h_is_refused_in_one_line(tmp_path: Path) -> None:
    levels = block_levels(F.BC6H, hdr_picture(16, 16), 1)
    dds = write_dds(tmp_path / "s.dds", F.BC6H, 16, 16, levels, dxgi=96)
    ktx = write_ktx2(tmp_path / "s.ktx2", F.BC6H, 16, 16, levels, vk_format=144)
    for path, what in ((dds, "BC6H_SF16"), (ktx, "signed BC6H")):
        with pytest.raises(EngineError, match=what) as info:
            read_block_file(path)
        assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_bc6h_padding_without_the_float_decoder_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without imagecodecs a BC6H file whose pack needs built blocks fails in one line saying what to
    install, and leaves no pack."""
    import sys

    levels = block_levels(F.BC6H, hdr_picture(64, 64), 1)
    texture = read_block_file(write_dds(tmp_path / "n.dds", F.BC6H, 64, 64, levels))
    monkeypatch.setitem(sys.modules, "imagecodecs", None)  # what `import imagecodecs` sees when it is missing
    with pytest.raises(
        EngineError,
        match=rf"^{tmp_path / 'n.dds'}: .* needs the imagecodecs package \(pip install 'texstream\[bc6h\]'\)",
    ):
        retile_to_pack(texture, tmp_path / "n.tpk", RetileConfig(tile_size=T, border=B))
    assert not (tmp_path / "n.tpk").exists()
