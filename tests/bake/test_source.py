"""Sources: the documented conversion rules for every Pillow mode, libvips streaming, clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import pyvips
from PIL import Image, ImageOps

from texstream.bake import ArraySource, PillowSource, VipsSource, bake, open_source
from texstream.config import BakeConfig
from texstream.errors import SourceError
from texstream.pack import TexelFormat

from .conftest import ASSETS, assemble, read_slots

W, H = 70, 45  # not multiples of anything


def _grey_rgba(g: np.ndarray, a: np.ndarray | int = 255) -> np.ndarray:
    return np.stack([g, g, g, np.broadcast_to(a, g.shape)], axis=-1).astype(np.uint8)


def _ramp(n: int = W * H, lo: int = 0, hi: int = 255) -> np.ndarray:
    return np.linspace(lo, hi, n).round().astype(np.int64).reshape(H, W)


def _mode_cases() -> dict[str, tuple[Image.Image, np.ndarray, int]]:
    """mode -> (image, expected RGBA, channels)."""
    rng = np.random.default_rng(11)
    rgb = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    alpha = rng.integers(0, 256, (H, W), dtype=np.uint8)
    grey = _ramp().astype(np.uint8)
    cases: dict[str, tuple[Image.Image, np.ndarray, int]] = {}
    bits = np.arange(W * H).reshape(H, W) % 3 == 0
    cases["1"] = (Image.fromarray(bits), _grey_rgba(bits.astype(np.uint8) * 255), 1)
    cases["L"] = (Image.fromarray(grey, "L"), _grey_rgba(grey), 1)
    la = np.stack([grey, alpha], -1)
    cases["LA"] = (Image.fromarray(la, "LA"), _grey_rgba(grey, alpha), 2)
    la_img = Image.frombytes("La", (W, H), la.tobytes())
    cases["La"] = (la_img, _grey_rgba(*np.moveaxis(np.asarray(la_img.convert("LA")), -1, 0)), 2)
    pal = Image.fromarray(rgb).quantize(16)
    cases["P"] = (
        pal,
        np.concatenate([np.asarray(pal.convert("RGB")), np.full((H, W, 1), 255, np.uint8)], -1),
        3,
    )
    pal_t = pal.copy()
    pal_t.info["transparency"] = 3
    cases["P+transparency"] = (pal_t, np.asarray(pal_t.convert("RGBA")), 4)
    pa = pal.convert("PA")
    pa.putalpha(Image.fromarray(alpha))
    cases["PA"] = (pa, np.asarray(pa.convert("RGBA")), 4)
    cases["RGB"] = (
        Image.fromarray(rgb, "RGB"),
        np.concatenate([rgb, np.full((H, W, 1), 255, np.uint8)], -1),
        3,
    )
    rgbx = np.concatenate([rgb, alpha[..., None]], -1)
    cases["RGBX"] = (Image.frombytes("RGBX", (W, H), rgbx.tobytes()), cases["RGB"][1], 3)
    cases["RGBA"] = (Image.fromarray(rgbx, "RGBA"), rgbx, 4)
    rgba_p = Image.frombytes("RGBa", (W, H), rgbx.tobytes())
    cases["RGBa"] = (rgba_p, np.asarray(rgba_p.convert("RGBA")), 4)
    v16 = _ramp(lo=0, hi=65535)
    v16.flat[:6] = [0, 128, 129, 257, 385, 65535]
    want16 = _grey_rgba(np.floor(v16 / 257 + 0.5).astype(np.uint8))
    assert want16[0, :6, 0].tolist() == [0, 0, 1, 1, 1, 255]
    for mode, dtype in [("I;16", "<u2"), ("I;16L", "<u2"), ("I;16B", ">u2"), ("I;16N", "=u2")]:
        cases[mode] = (Image.frombytes(mode, (W, H), v16.astype(dtype).tobytes()), want16, 1)
    i32 = _ramp(lo=-1000, hi=70000)
    cases["I"] = (
        Image.frombytes("I", (W, H), i32.astype("<i4").tobytes()),
        _grey_rgba(np.floor(np.clip(i32, 0, 65535) / 257 + 0.5).astype(np.uint8)),
        1,
    )
    f = np.linspace(-0.5, 1.5, W * H, dtype=np.float32).reshape(H, W)
    f.flat[:3] = [0.5, np.nan, 1.0]
    cases["F"] = (
        Image.fromarray(f, "F"),
        _grey_rgba(np.rint(np.clip(np.nan_to_num(f), 0, 1) * 255).astype(np.uint8)),
        1,
    )
    for mode in ("CMYK", "YCbCr", "LAB", "HSV"):
        img = (
            Image.fromarray(rgb, "RGB").convert(mode)
            if mode != "LAB"
            else Image.frombytes("LAB", (W, H), rgb.tobytes())
        )
        if mode == "HSV":
            img = Image.frombytes("HSV", (W, H), rgb.tobytes())
        want = np.concatenate([np.asarray(img.convert("RGB")), np.full((H, W, 1), 255, np.uint8)], -1)
        cases[mode] = (img, want, 3)
    return cases


CASES = _mode_cases()


@pytest.mark.parametrize("mode", list(CASES))
def test_pillow_mode_conversion(mode: str) -> None:
    img, want, channels = CASES[mode]
    src = PillowSource(img, name=mode)
    assert (src.width, src.height, src.channels) == (W, H, channels)
    got = src.read_rows(0, H)
    assert got.dtype == np.uint8 and got.shape == (H, W, 4)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("mode", list(CASES))
def test_pillow_modes_bake(mode: str, tmp_path: Path) -> None:
    img, want, _ = CASES[mode]
    out = tmp_path / "m.tpk"
    bake(
        PillowSource(img, name=mode),
        out,
        BakeConfig(texel_format=TexelFormat.RGBA8, tile_size=64, jobs=1, progress=False),
    )
    header, slots = read_slots(out)
    got = assemble(header, slots, 0)
    visible = want[..., 3] > 0  # colour under alpha 0 is bled from its neighbours (test_alpha)
    assert np.array_equal(got[visible], want[visible]) and np.array_equal(got[..., 3], want[..., 3])


def test_first_frame_of_multiframe_files(tmp_path: Path) -> None:
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0))]
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    src = open_source(path)
    assert tuple(src.read_rows(0, 1)[0, 0, :3]) == (255, 0, 0)


def test_array_source_rules() -> None:
    a16 = np.array([[0, 128, 129, 65535]], np.uint16)
    assert ArraySource(a16).read_rows(0, 1)[0, :, 0].tolist() == [0, 0, 1, 255]
    f = np.array([[[-1.0, 0.5], [2.0, np.nan]]])
    got = ArraySource(f).read_rows(0, 1)
    assert got[0, :, 0].tolist() == [0, 255] and got[0, :, 3].tolist() == [128, 0]
    assert ArraySource(np.array([[True, False]])).read_rows(0, 1)[0, :, 0].tolist() == [255, 0]
    with pytest.raises(ValueError, match="shape"):
        ArraySource(np.zeros((4, 4, 5), np.uint8))
    with pytest.raises(ValueError, match="dtype"):
        ArraySource(np.zeros((4, 4), np.complex64))
    with pytest.raises(ValueError, match="row range"):
        ArraySource(np.zeros((4, 4), np.uint8)).read_rows(2, 5)


# ---- files: Pillow below the threshold, libvips above it -------------------------------------------
def _read_all(src: object, step: int = 97) -> np.ndarray:
    return np.concatenate([src.read_rows(y, min(src.height, y + step)) for y in range(0, src.height, step)])


def test_vips_matches_pillow_on_a_photo() -> None:
    path = ASSETS / "coffee.png"
    pil = open_source(path)
    vips = open_source(path, vips_threshold=0)
    assert isinstance(pil, PillowSource) and isinstance(vips, VipsSource)
    assert (vips.width, vips.height, vips.channels) == (pil.width, pil.height, 3)
    assert np.array_equal(_read_all(vips), pil.read_rows(0, pil.height))


def test_vips_applies_the_same_rules(tmp_path: Path) -> None:
    v16 = (np.arange(40 * 30, dtype=np.uint32) * 57 % 65536).astype(np.uint16).reshape(30, 40)
    grey16 = tmp_path / "grey16.png"
    Image.frombytes("I;16", (40, 30), v16.tobytes()).save(grey16)
    want = _grey_rgba(np.floor(v16 / 257 + 0.5).astype(np.uint8))
    assert np.array_equal(_read_all(open_source(grey16, vips_threshold=0)), want)
    assert np.array_equal(_read_all(open_source(grey16)), want)
    # 16-bit RGBA TIFF (region reads, not sequential), odd strip boundaries.
    rgba16 = (np.arange(30 * 40 * 4, dtype=np.uint32) * 331 % 65536).astype(np.uint16).reshape(30, 40, 4)
    tif = tmp_path / "rgba16.tif"
    pyvips.Image.new_from_memory(rgba16.tobytes(), 40, 30, 4, "ushort").copy(interpretation="rgb16").write_to_file(
        str(tif)
    )
    src = open_source(tif, vips_threshold=0)
    assert src.channels == 4
    assert np.array_equal(_read_all(src, 7), np.floor(rgba16 / 257 + 0.5).astype(np.uint8))
    # Float: clipped to [0, 1].
    f = np.linspace(-0.5, 1.5, 40 * 30, dtype=np.float32).reshape(30, 40)
    ftif = tmp_path / "f.tif"
    pyvips.Image.new_from_memory(f.tobytes(), 40, 30, 1, "float").write_to_file(str(ftif))
    assert np.array_equal(
        _read_all(open_source(ftif, vips_threshold=0))[..., 0], np.rint(np.clip(f, 0, 1) * 255).astype(np.uint8)
    )


def test_vips_streams_top_to_bottom_only() -> None:
    src = open_source(ASSETS / "chelsea.png", vips_threshold=0)
    src.read_rows(100, 200)
    with pytest.raises(ValueError, match="top to bottom"):
        src.read_rows(0, 10)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="nope.png: no such file"):
        open_source(tmp_path / "nope.png")


def test_folder(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="folder"):
        open_source(tmp_path)


def test_not_an_image(tmp_path: Path) -> None:
    path = tmp_path / "notes.png"
    path.write_text("hello, not a png\n")
    with pytest.raises(SourceError, match="notes.png: not an image") as info:
        open_source(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("threshold", [None, 0])
def test_truncated_image(tmp_path: Path, threshold: int | None) -> None:
    data = (ASSETS / "astronaut.png").read_bytes()
    path = tmp_path / "cut.png"
    path.write_bytes(data[: len(data) // 2])
    kwargs = {} if threshold is None else {"vips_threshold": threshold}
    with pytest.raises(SourceError, match="cut.png") as info:
        src = open_source(path, **kwargs)
        _read_all(src, 128)  # libvips may only notice when it reaches the missing rows
    assert "\n" not in str(info.value)


# ---- plain PNG files: decoded by libspng where imagecodecs is installed -------------------------------
def _png_cases(tmp_path: Path) -> dict[str, tuple[Path, bool]]:
    """name -> (a PNG file, whether `plain_png_layout` takes it: its samples are its pixels)."""
    rng = np.random.default_rng(5)
    rgb = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    rgb[:5, :5] = (10, 20, 30)  # the transparency key below
    rgba = np.dstack([rgb, rng.integers(0, 256, (H, W), dtype=np.uint8)])
    cases: dict[str, tuple[Path, bool]] = {}

    def save(name: str, plain: bool, image: Image.Image, **params: object) -> None:
        path = tmp_path / f"{name}.png"
        image.save(path, **params)
        cases[name] = (path, plain)

    save("rgb", True, Image.fromarray(rgb))
    save("rgba", True, Image.fromarray(rgba))
    save("grey", True, Image.fromarray(rgb[..., 0], "L"))
    save("grey16", False, Image.fromarray((_ramp() * 257).astype(np.uint16)))
    save("palette", False, Image.fromarray(rgb).quantize(16))
    save("key", False, Image.fromarray(rgb), transparency=(10, 20, 30))
    exif = Image.Exif()
    exif[0x0112] = 3
    save("exif", False, Image.fromarray(rgb), exif=exif.tobytes())
    from PIL.PngImagePlugin import PngInfo

    xmp = PngInfo()
    xmp.add_itxt("XML:com.adobe.xmp", '<x:xmpmeta><rdf:Description tiff:Orientation="3"/></x:xmpmeta>')
    save("xmp", False, Image.fromarray(rgb), pnginfo=xmp)
    text = PngInfo()
    text.add_text("Software", "a paint program")
    save("text", True, Image.fromarray(rgb), pnginfo=text)
    save("animated", False, Image.fromarray(rgb), save_all=True, append_images=[Image.fromarray(rgb[::-1].copy())])
    interlaced = tmp_path / "interlaced.png"
    pyvips.Image.new_from_array(rgb, interpretation="srgb").pngsave(str(interlaced), interlace=True)
    cases["interlaced"] = (interlaced, False)
    return cases


def test_plain_png_layout_takes_only_files_whose_samples_are_their_pixels(tmp_path: Path) -> None:
    from texstream.bake.png_plain import plain_png_layout

    for name, (path, plain) in _png_cases(tmp_path).items():
        channels = {"rgb": 3, "rgba": 4, "grey": 1, "text": 3}.get(name)
        assert plain_png_layout(path.read_bytes()) == ((W, H, channels) if plain else None), name
    data = (tmp_path / "rgb.png").read_bytes()
    assert plain_png_layout(data[:-12]) is None  # ends before IEND: Pillow reports the damage
    assert plain_png_layout(b"GIF89a" + data[6:]) is None


@pytest.mark.parametrize("imagecodecs", [True, False])
def test_png_files_decode_as_pillow_decodes_them(
    tmp_path: Path, imagecodecs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every PNG gives Pillow's pixels, channel meaning and metadata, whichever decoder reads it."""
    from texstream.bake.source import pil_to_rgba

    if not imagecodecs:
        monkeypatch.setitem(__import__("sys").modules, "imagecodecs", None)  # not installed
    for name, (path, _) in _png_cases(tmp_path).items():
        with Image.open(path) as img:
            want, channels = pil_to_rgba(ImageOps.exif_transpose(img))  # shown upright
        src = open_source(path)
        assert isinstance(src, PillowSource)
        np.testing.assert_array_equal(src.read_rows(0, H), want, err_msg=name)
        assert src.channels == channels and src.describe()["source_mode"] == Image.open(path).mode, name
    assert open_source(tmp_path / "exif.png").orientation == open_source(tmp_path / "xmp.png").orientation == 3
    key = open_source(tmp_path / "key.png").read_rows(0, H)
    assert (key[:5, :5, 3] == 0).all() and key[5:, :, 3].min() == 255  # the transparency key applied


def test_damaged_plain_png_is_one_line(tmp_path: Path) -> None:
    data = bytearray((ASSETS / "astronaut.png").read_bytes())
    at = data.index(b"IDAT") + 4 + 1000
    data[at : at + 64] = bytes(64)  # zeroed compressed bytes, the chunk's length and IEND intact
    path = tmp_path / "damaged.png"
    path.write_bytes(bytes(data))
    with pytest.raises(SourceError, match="damaged.png") as info:
        open_source(path)
    assert "\n" not in str(info.value)
