"""High dynamic range images end to end: Radiance HDR and OpenEXR files read (hostile ones refused in
one line), baked in float to BC6H packs (pack format 3), checked against an independent BC6H decoder
(texture2ddecoder) and the float source, and streamed through a BC6H cache pool."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import moderngl
import numpy as np
import pytest
import texture2ddecoder as t2d

import texstream as ts
from texstream.assets import ImageBakeSettings, PackCache, PackCacheConfig, pack_for_image
from texstream.assets.hdr import parse_hdr, read_hdr, rgbe_to_float
from texstream.errors import PackFormatError, SourceError
from texstream.pack import PackReader, TexelFormat
from texstream.pack import format as pack_format
from texstream.testing import psnr

from .hdr_files import float_to_rgbe, hdr_bytes, sky, write_exr, write_hdr


def tone(v: np.ndarray) -> np.ndarray:
    """Reinhard's x / (1 + x): any non-negative value into [0, 1), so values far above 1 still count."""
    v = np.maximum(np.asarray(v, np.float64), 0.0)
    return v / (1.0 + v)


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[PackCache]:
    with PackCache(PackCacheConfig(folder=tmp_path / "packs")) as c:
        yield c


# ---- the Radiance reader --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("size", "rle"), [((40, 9), True), ((40, 9), False), ((5, 3), True), ((300, 2), True)], ids=str
)
def test_radiance_pictures_decode_to_their_rgbe_values(size: tuple[int, int], rle: bool) -> None:
    img = sky(*size)
    expected = rgbe_to_float(float_to_rgbe(img))
    got = parse_hdr(hdr_bytes(img, rle=rle)).rgb
    assert got.shape == (size[1], size[0], 3) and got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    # RGBE: 8 mantissa bits under the largest channel's exponent
    assert np.max(np.abs(got - img).max(axis=-1) / img.max(axis=-1)) < 1 / 128


def test_rgbe_values_follow_radiance() -> None:
    texels = np.array([[[128, 64, 32, 129], [0, 0, 0, 0], [255, 0, 1, 136]]], np.uint8)
    np.testing.assert_array_equal(
        rgbe_to_float(texels), [[[128.5 / 128, 64.5 / 128, 32.5 / 128], [0, 0, 0], [255.5, 0.5, 1.5]]]
    )


@pytest.mark.parametrize(
    ("resolution", "flip"),
    [("+Y 6 +X 24", (True, False)), ("-Y 6 -X 24", (False, True)), ("+Y 6 -X 24", (True, True))],
)
def test_pictures_stored_bottom_up_or_mirrored_read_top_row_first(resolution: str, flip: tuple[bool, bool]) -> None:
    img = sky(24, 6)
    stored = img[::-1] if flip[0] else img
    stored = stored[:, ::-1] if flip[1] else stored
    got = parse_hdr(hdr_bytes(stored, resolution=resolution)).rgb
    np.testing.assert_array_equal(got, rgbe_to_float(float_to_rgbe(img)))


def _picture(body: bytes, header: bytes = b"FORMAT=32-bit_rle_rgbe\n", resolution: bytes = b"-Y 2 +X 8") -> bytes:
    return b"#?RADIANCE\n" + header + b"\n" + resolution + b"\n" + body


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "no #?RADIANCE signature"),
        (b"P6\n8 8\n255\n", "no #?RADIANCE signature"),
        (b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n", "truncated in the header"),
        (b"#?RADIANCE\n" + b"# comment\n" * 7000, "header is longer than 65536 bytes"),
        (_picture(b"", header=b"FORMAT=32-bit_rle_xyze\n"), "pixel format '32-bit_rle_xyze' is not supported"),
        (_picture(b"", header=b"EXPOSURE=-1\n"), "EXPOSURE is not a positive number"),
        (_picture(b"", resolution=b"-Y 2 +X"), "resolution line is not of the form"),
        (_picture(b"", resolution=b"+X 8 -Y 2"), "column by column"),
        (_picture(b"", resolution=b"-Y 0 +X 8"), "outside 1..1048576 a side"),
        (_picture(b"", resolution=b"-Y 99999 +X 99999"), "over the 67,108,864-texel limit"),
        (_picture(b"\x02\x02\x00\x08" * 3, resolution=b"-Y 60000 +X 1000"), "holds only 12 bytes of pixels"),
        (_picture(b"\x01\x01\x01\x05" * 16), "old run-length encoding"),
        (_picture(b"\x02\x02\x00\x09" + b"\x00" * 64), "says it is 9 texels wide, the picture 8"),
        (_picture(b"\x02\x02\x00\x08\x00" + b"\x00" * 64), "bad run (count 0)"),
        (_picture(b"\x02\x02\x00\x08\x89\x01" + b"\x00" * 64), "run past its end"),
        (_picture(b"\x02\x02\x00\x08\x08" + b"\x00" * 7, resolution=b"-Y 1 +X 8"), "truncated at scanline 0"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_hostile_radiance_files_are_refused_in_one_line(tmp_path: Path, data: bytes, reason: str) -> None:
    path = tmp_path / "hostile.hdr"
    path.write_bytes(data)
    with pytest.raises(SourceError) as info:
        read_hdr(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and reason in message, message


def test_every_truncation_is_refused_or_read_whole() -> None:
    data = hdr_bytes(sky(24, 5))
    for cut in range(len(data)):
        with pytest.raises(SourceError, match="^cut.hdr: "):
            parse_hdr(data[:cut], "cut.hdr")
    assert parse_hdr(data + b"trailing bytes are ignored").rgb.shape == (5, 24, 3)


# ---- OpenEXR -----------------------------------------------------------------------------------------------
def test_exr_files_read_as_float32_rgb(tmp_path: Path) -> None:
    from texstream.assets.exr import read_exr

    img = sky(40, 24)
    np.testing.assert_array_equal(read_exr(write_exr(tmp_path / "half.exr", img)), img.astype(np.float16))
    np.testing.assert_array_equal(read_exr(write_exr(tmp_path / "full.exr", img, half=False)), img)


def test_exr_alpha_is_dropped_with_a_one_line_warning(
    tmp_path: Path, cache: PackCache, caplog: pytest.LogCaptureFixture
) -> None:
    """An RGBA EXR: its colour is read and baked to BC6H as from an RGB file, and one warning line
    naming the file says the alpha is dropped; an RGB file gives no warning."""
    from texstream.assets.exr import read_exr

    rgb = sky(64, 48)
    alpha = np.linspace(0, 1, 64 * 48, dtype=np.float32).reshape(48, 64, 1)
    path = write_exr(tmp_path / "alpha.exr", np.concatenate([rgb, alpha], -1))
    with caplog.at_level("WARNING", logger="texstream.assets.exr"):
        np.testing.assert_array_equal(read_exr(path), rgb.astype(np.float16))
        read_exr(write_exr(tmp_path / "plain.exr", rgb))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"{path}: its alpha channel is dropped (BC6H packs hold RGB only)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="texstream.assets.exr"):
        pack = pack_for_image(path, cache=cache, jobs=1)
    assert any("alpha channel is dropped" in r.getMessage() for r in caplog.records)
    with PackReader(pack) as r:
        assert r.header.texel_format is TexelFormat.BC6H
    cache.release(pack)


def test_hostile_exr_files_are_refused_in_one_line(tmp_path: Path) -> None:
    from texstream.assets.exr import read_exr

    good = write_exr(tmp_path / "good.exr", sky(40, 24)).read_bytes()
    for name, data in {
        "truncated": good[: len(good) // 2],
        "garbage": good[:4] + b"\xff" * 300,
        "png": b"\x89PNG",
    }.items():
        path = tmp_path / f"{name}.exr"
        path.write_bytes(data)
        with pytest.raises(SourceError) as info:
            read_exr(path)
        assert "\n" not in str(info.value) and str(info.value).startswith(f"{path}: "), info.value
    with pytest.raises(SourceError, match="texels is outside 1..100 texels"):
        read_exr(tmp_path / "good.exr", max_texels=100)


# ---- bake to BC6H ----------------------------------------------------------------------------------------------
def _level0(reader: PackReader) -> np.ndarray:
    """Level 0 decoded by texture2ddecoder (linear values clipped to [0, 1], 8 bits), RGB, from the
    pack's tiles' content blocks."""
    h = reader.header
    w, hh = h.level_dims(0)
    t, b, s = h.tile_size, h.border, h.slot_size
    tx, ty = h.tiles_in_level(0)
    out = np.zeros((ty * t, tx * t, 3), np.uint8)
    for y in range(ty):
        for x in range(tx):
            bgra = np.frombuffer(t2d.decode_bc6(reader.read_tile(0, x, y), s, s), np.uint8).reshape(s, s, 4)
            out[y * t : (y + 1) * t, x * t : (x + 1) * t] = bgra[b : b + t, b : b + t, 2::-1]
    return out[:hh, :w]


@pytest.mark.parametrize("kind", ["hdr", "exr"])
def test_hdr_files_bake_to_linear_bc6h_packs(tmp_path: Path, cache: PackCache, kind: str) -> None:
    img = sky(300, 200) * np.float32(0.25)  # mostly below 1, the sun above it: both halves are checked
    write = write_hdr if kind == "hdr" else write_exr
    src = write(tmp_path / f"sky_rough.{kind}", img)  # a data name: HDR content wins over it
    pack = pack_for_image(src, cache=cache, jobs=1)
    with PackReader(pack) as reader:
        h = reader.header
        assert (h.texel_format, h.srgb, reader.version, (h.width, h.height)) == (TexelFormat.BC6H, False, 3, (300, 200))
        assert reader.metadata["content_kind"] == "hdr"
        assert reader.verify() == []
        decoded = _level0(reader)
    below = img < 1.0
    assert below.mean() > 0.9 and (~below).any()
    clipped = np.clip(img, 0.0, 1.0) * 255.0
    assert psnr(decoded, clipped, peak=255.0) >= 50.0  # measured 55.7 (.hdr) and 55.9 (.exr)


def test_an_8_bit_source_baked_to_bc6h_holds_its_values_linear(tmp_path: Path, cache: PackCache) -> None:
    from PIL import Image

    y, x = np.mgrid[0:128, 0:128]
    waves = [np.sin(x / 9.0 + c) * np.cos(y / 13.0 - c) for c in range(3)]
    img = np.rint(np.stack(waves, -1) * 100 + 128).astype(np.uint8)
    Image.fromarray(img).save(tmp_path / "smooth.png")
    settings = ImageBakeSettings(texel_format=TexelFormat.BC6H)
    with PackReader(pack_for_image(tmp_path / "smooth.png", cache=cache, jobs=1, settings=settings)) as reader:
        assert (reader.header.texel_format, reader.header.srgb) == (TexelFormat.BC6H, False)
        assert psnr(_level0(reader), img, peak=255.0) >= 38.0  # measured 41.2 (ispc's veryfast profile: 35.8)


def test_older_readers_refuse_bc6h_packs_as_newer(tmp_path: Path, cache: PackCache, monkeypatch) -> None:  # noqa: ANN001
    """A reader that knows pack formats up to 2 (every texstream before BC6H) says to upgrade; BC1
    packs are still written as format 2, which it reads."""
    pack = pack_for_image(write_hdr(tmp_path / "sky.hdr", sky(64, 64)), cache=cache, jobs=1)
    photo = tmp_path / "photo.png"
    from PIL import Image

    Image.fromarray((np.clip(sky(64, 64), 0, 1) * 255).astype(np.uint8)).save(photo)
    ldr = pack_for_image(photo, cache=cache, jobs=1)
    monkeypatch.setattr(pack_format, "READ_VERSIONS", (1, 2))
    with pytest.raises(
        PackFormatError, match=r"written by a newer texstream \(format 3; this one reads formats up to 2\)"
    ):
        PackReader(pack)
    with PackReader(ldr) as reader:
        assert reader.version == 2 and reader.header.texel_format is TexelFormat.BC1


# ---- streamed -----------------------------------------------------------------------------------------------------
SIZE = 128  # framebuffer side
VS = """#version 450 core
#include "texstream/common.glsl"
out vec2 v_uv;
void main() {
    v_uv = ts_fullscreen_uv(gl_VertexID);
    gl_Position = ts_fullscreen_position(gl_VertexID);
}
"""
FS = """#version 450 core
#include "texstream/vt.glsl"
VT_DECLARE(u_vt)
uniform vec4 u_window;  // uv of the screen's bottom-left corner, uv span across the screen
in vec2 v_uv;
out vec4 f_color;
void main() { f_color = vec4(VT_SAMPLE(u_vt, u_window.xy + v_uv * u_window.zw).rgb, 1.0); }
"""


class FloatScreen:
    """Draws a virtual texture into a float (RGBA32F) framebuffer: values above 1 survive."""

    def __init__(self, ctx: moderngl.Context) -> None:
        self.ctx = ctx
        self.prog = ts.program(ctx, vertex=VS, fragment=FS)
        self.vao = ctx.vertex_array(self.prog, [])
        self.colour = ctx.texture((SIZE, SIZE), 4, dtype="f4")
        self.fbo = ctx.framebuffer(color_attachments=[self.colour])

    def draw(self, vt: ts.VirtualTexture, window: tuple[float, float, float, float]) -> np.ndarray:
        """(SIZE, SIZE, 3) float32; row j is the screen row j from the bottom (v grows with j)."""
        self.fbo.use()
        self.fbo.clear(0.0, 0.0, 0.0, 1.0)
        self.prog["u_window"].value = window
        vt.bind(self.prog, "u_vt")
        self.vao.render(moderngl.TRIANGLES, vertices=3)
        return np.frombuffer(self.fbo.read(components=4, dtype="f4"), np.float32).reshape(SIZE, SIZE, 4)[..., :3]

    def release(self) -> None:
        if self.ctx.fbo is self.fbo:
            self.ctx.detect_framebuffer(0).use()
        for obj in (self.vao, self.fbo, self.colour, self.prog):
            obj.release()


@pytest.fixture
def screen(gl_context: moderngl.Context) -> Iterator[FloatScreen]:
    s = FloatScreen(gl_context)
    s.fbo.use()  # the viewport the streamer sizes its feedback from
    yield s
    s.release()


@pytest.mark.gl
def test_an_hdr_file_streams_through_a_bc6h_pool(
    screen: FloatScreen, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened by path: baked into the pack cache, streamed from its pinned levels by feedback alone
    until it equals the all-resident frame; that frame at 1:1 is the GPU's BC6H decoding of the
    pack's blocks (checked against texture2ddecoder's) and, tone-mapped, the float source."""
    monkeypatch.setenv("TEXSTREAM_CACHE", str(tmp_path / "cache"))
    img = sky(512, 512)
    img[:, (np.arange(512) // 2) % 2 == 0] *= np.float32(0.6)  # fine stripes: only level 0 shows them
    src = write_hdr(tmp_path / "sky.hdr", img)
    window = (0.5, 0.125, SIZE / 512, SIZE / 512)  # texels 256..383 x 64..191 (the sun), 1:1
    x0, y0 = 256, 64
    with ts.Streamer(screen.ctx, ts.StreamerConfig(pinned_levels=2)) as streamer:
        vt = streamer.open(src, origin=ts.Origin.TOP_LEFT)
        assert vt.header.texel_format is TexelFormat.BC6H and "bc6h" in vt.pool.name
        first = screen.draw(vt, window)
        settled = 0
        for i in range(300):  # feedback comes back a frame or two after the draw that wrote it
            stats = streamer.update()
            frame = screen.draw(vt, window)
            known = i >= 3 and stats.wanted_pages > 0  # its feedback read: nothing is missing before that
            settled = settled + 1 if known and stats.missing_pages == 0 and not streamer.busy else 0
            if settled == 3:
                break
        with ts.Streamer(screen.ctx) as reference:
            ref_vt = reference.open(src, origin=ts.Origin.TOP_LEFT)
            reference.make_all_resident(ref_vt)
            reference.update()
            expected = screen.draw(ref_vt, window)
        with PackReader(vt.path) as reader:
            blocks = _level0(reader)[y0 : y0 + SIZE, x0 : x0 + SIZE]
    assert expected.max() > 4.0  # the sun, above 1 on screen: the pool holds floats
    assert psnr(tone(first), tone(expected), peak=1.0) < 35.0  # the pinned levels alone are a blur (measured 31.4)
    assert psnr(tone(frame), tone(expected), peak=1.0) >= 45.0
    # BC6H as decoded by the GPU and by texture2ddecoder (8 bits, clipped to [0, 1])
    assert psnr(np.clip(expected, 0.0, 1.0) * 255.0, blocks, peak=255.0) >= 45.0  # measured 48.5
    assert psnr(tone(expected), tone(img[y0 : y0 + SIZE, x0 : x0 + SIZE]), peak=1.0) >= 45.0  # measured 51.8


@pytest.mark.gl
def test_a_bc6h_dds_streams_its_own_blocks(
    screen: FloatScreen, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Streamer.open` of a BC6H_UF16 DDS: re-tiled once, and the GPU's texels at 1:1 are the file's own
    blocks decoded (bcdec's half floats, and texture2ddecoder's 8-bit view), highlights above 1 kept."""
    import imagecodecs

    from .files import block_levels, hdr_picture, write_dds

    monkeypatch.setenv("TEXSTREAM_CACHE", str(tmp_path / "cache"))
    img = hdr_picture(256, 256, seed=9)
    levels = block_levels(TexelFormat.BC6H, img, 9)
    src = write_dds(tmp_path / "sky.dds", TexelFormat.BC6H, 256, 256, levels)
    x0, y0 = 64, 96
    window = (x0 / 256, y0 / 256, SIZE / 256, SIZE / 256)
    with ts.Streamer(screen.ctx) as streamer:
        vt = streamer.open(src, origin=ts.Origin.TOP_LEFT)
        assert vt.header.texel_format is TexelFormat.BC6H and "bc6h" in vt.pool.name
        streamer.make_all_resident(vt)
        streamer.update()
        frame = screen.draw(vt, window)
    file_texels = imagecodecs.bcn_decode(levels[0].tobytes(), 6, shape=(256, 256, 3)).astype(np.float32)
    expected = file_texels[y0 : y0 + SIZE, x0 : x0 + SIZE]
    assert expected.max() > 2.0 and frame.max() > 2.0  # the highlight, above 1 on screen
    # within a fifth of a half float's step (2^-10): the same half floats, up to the filter's rounding
    np.testing.assert_allclose(frame, expected, rtol=2e-4, atol=1e-5)
    bgra = np.frombuffer(t2d.decode_bc6(levels[0].tobytes(), 256, 256), np.uint8).reshape(256, 256, 4)
    t2d_view = bgra[y0 : y0 + SIZE, x0 : x0 + SIZE, 2::-1].astype(np.float32)
    assert psnr(np.clip(frame, 0.0, 1.0) * 255.0, t2d_view, peak=255.0) >= 45.0


@pytest.mark.parametrize("mode", ["clamp", "wrap"])
def test_float_bands_on_workers_give_the_in_process_pack(tmp_path: Path, monkeypatch, mode: str) -> None:  # noqa: ANN001
    """Small bands on two worker processes (the shared ring carrying float32 rows, wrap's deferred
    top tile rows cut from float rows): the same pack, byte for byte, as one band in this process."""
    from texstream.bake import bake, jobs
    from texstream.bake.float_source import FloatImageSource

    source = FloatImageSource(sky(300, 260), "sky", "test")
    config = ts.BakeConfig(texel_format=TexelFormat.BC6H, tile_size=64, address_mode=mode, progress=False)
    bake(source, tmp_path / "one.tpk", dataclasses.replace(config, jobs=1))
    monkeypatch.setattr(jobs, "BAND_BYTES", 1 << 16)
    report = bake(source, tmp_path / "two.tpk", dataclasses.replace(config, jobs=2))
    assert report.jobs == 2
    with PackReader(tmp_path / "one.tpk") as one, PackReader(tmp_path / "two.tpk") as two:
        assert one.header == two.header and one.header.texel_format is TexelFormat.BC6H
        for i in range(one.header.tile_count):
            assert one.read_tile(*one.tile_position(i)) == two.read_tile(*two.tile_position(i)), i
        decoded = _level0(two)
    assert psnr(decoded, np.clip(sky(300, 260), 0.0, 1.0) * 255.0, peak=255.0) >= 45.0
