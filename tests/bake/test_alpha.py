"""Alpha in the bake: detection, the automatic format, the warning for formats that drop it,
premultiplied mips without halos, colour bled into transparent texels, and EXIF orientation."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from texstream.bake import ArraySource, PillowSource, bake, open_source
from texstream.bake.format_choice import ALPHA_FORMATS, choose_format
from texstream.bake.source import has_alpha
from texstream.config import BakeConfig
from texstream.pack import AddressMode, PackReader, TexelFormat
from texstream.pack.extract import extract_level

from . import reference as ref
from .conftest import assemble, load_photo, read_slots


def _cfg(**kw: object) -> BakeConfig:
    base: dict = {"tile_size": 64, "jobs": 1, "progress": False, "bc7_quality": "fast"}
    base.update(kw)
    return BakeConfig(**base)


def _disc(n: int, background: tuple[int, int, int]) -> np.ndarray:
    """A white disc with a one-texel antialiased edge on a transparent background of some colour."""
    y, x = np.mgrid[0:n, 0:n] + 0.5
    coverage = np.clip(0.3 * n - np.hypot(x - n / 2, y - n / 2) + 0.5, 0.0, 1.0)
    img = np.zeros((n, n, 4), np.uint8)
    img[..., :3] = background
    img[coverage > 0, :3] = 255
    img[..., 3] = np.rint(coverage * 255).astype(np.uint8)
    return img


class Once:
    """A source read once, top to bottom (no `forkable`, no `has_alpha`): it cannot be scanned ahead."""

    def __init__(self, rgba: np.ndarray) -> None:
        self.rgba, self.name, self.channels = rgba, "once", 4
        self.height, self.width = rgba.shape[:2]

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        return self.rgba[y0:y1]


# ---- float64 reference: premultiplied box filter ------------------------------------------------------
def premultiplied_pyramid(rgba: np.ndarray, count: int, wrap: bool) -> list[np.ndarray]:
    """uint8 levels 1.. of `rgba` (sRGB colour), colour filtered as sum(c * a) / sum(a) in linear light."""
    lin = ref.to_linear(rgba, srgb=True)
    levels = [rgba]
    for _ in range(count - 1):
        pre = lin.copy()
        pre[..., :3] *= pre[..., 3:]
        nxt = ref.next_level(pre, wrap)
        a = nxt[..., 3:]
        nxt[..., :3] = np.divide(nxt[..., :3], a, out=np.zeros_like(nxt[..., :3]), where=a > 0)
        lin = nxt
        levels.append(ref.to_u8(lin, srgb=True))
    return levels


# ---- detection and the format choice ---------------------------------------------------------------
def test_alpha_detection(tmp_path: Path) -> None:
    rgba = load_photo("coffee.png")[:64, :80].copy()
    assert has_alpha(ArraySource(rgba)) is False  # RGBA, every alpha 255: opaque
    assert has_alpha(ArraySource(rgba[..., :3])) is False
    cut = rgba.copy()
    cut[40, 70, 3] = 254
    assert has_alpha(ArraySource(cut)) is True
    grey_alpha = np.stack([rgba[..., 0], np.full(rgba.shape[:2], 255, np.uint8)], -1)
    assert has_alpha(ArraySource(grey_alpha)) is False
    grey_alpha[63, 0, 1] = 0
    assert ArraySource(grey_alpha).channels == 2 and has_alpha(ArraySource(grey_alpha)) is True
    assert has_alpha(Once(cut)) is None  # read once: not scanned ahead
    for name, img in (("opaque.png", rgba), ("cut.png", cut)):
        Image.fromarray(img, "RGBA").save(tmp_path / name)
        want = name == "cut.png"
        pillow, vips = open_source(tmp_path / name), open_source(tmp_path / name, vips_threshold=0)
        assert type(vips).__name__ == "VipsSource" and isinstance(pillow, PillowSource)
        assert has_alpha(pillow) is want and has_alpha(vips) is want
        assert np.array_equal(vips.read_rows(0, 64), img)  # the alpha scan left the stream at row 0
    Image.fromarray(grey_alpha, "LA").save(tmp_path / "la.png")
    assert has_alpha(open_source(tmp_path / "la.png")) is True
    assert has_alpha(open_source(tmp_path / "la.png", vips_threshold=0)) is True


def test_automatic_format(tmp_path: Path) -> None:
    opaque = load_photo("coffee.png")[:100, :120].copy()
    cut = _disc(128, (255, 0, 0))
    cases = [  # (source, given format, chosen format, auto, alpha recorded)
        (ArraySource(opaque), None, TexelFormat.BC1, True, False),
        (ArraySource(opaque[..., :3]), None, TexelFormat.BC1, True, False),
        (ArraySource(cut), None, TexelFormat.BC7, True, True),
        (Once(cut), None, TexelFormat.BC7, True, True),  # 4 channels, not scannable: kept; bands saw it
        (ArraySource(cut), TexelFormat.BC3, TexelFormat.BC3, False, True),  # seen by the bands
        (ArraySource(opaque), TexelFormat.RGBA8, TexelFormat.RGBA8, False, False),
        (ArraySource(cut), TexelFormat.RGBA8, TexelFormat.RGBA8, False, True),
        (ArraySource(cut), TexelFormat.BC1, TexelFormat.BC1, False, True),
    ]
    for i, (src, given, chosen, auto, alpha) in enumerate(cases):
        assert choose_format(src, _cfg(texel_format=given)).texel_format is chosen
        out = tmp_path / f"{i}.tpk"
        report = bake(src, out, _cfg(texel_format=given))
        with PackReader(out) as r:
            meta, fmt = r.metadata, r.header.texel_format
        assert fmt is chosen and report.texel_format == chosen.name.lower(), i
        assert meta["format"] == chosen.name.lower() and meta["format_auto"] is auto, i
        assert meta["alpha"] is alpha, i
        assert meta["mip_filter"].endswith("-premultiplied") == (alpha and chosen in ALPHA_FORMATS), i


def test_a_format_that_drops_alpha_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cut = _disc(64, (0, 0, 0))
    with caplog.at_level(logging.WARNING, logger="texstream"):
        bake(ArraySource(cut, name="disc"), tmp_path / "a.tpk", _cfg(texel_format=TexelFormat.BC1))
        bake(ArraySource(cut, name="disc"), tmp_path / "b.tpk", _cfg(texel_format=TexelFormat.BC7))
        bake(ArraySource(cut[..., :3], name="rgb"), tmp_path / "c.tpk", _cfg(texel_format=TexelFormat.BC1))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["disc has alpha; bc1 drops it (use --format bc3 or bc7)"]


# ---- premultiplied mips and bleeding -----------------------------------------------------------------
@pytest.mark.parametrize("fmt", [None, TexelFormat.BC3, TexelFormat.RGBA8])
@pytest.mark.parametrize("background", [(0, 0, 0), (255, 0, 0)])
def test_cut_out_edges_keep_their_colour(tmp_path: Path, fmt: TexelFormat | None, background: tuple) -> None:
    """A white disc on a transparent black or red background: every visible texel of levels 0..3,
    decoded, stays white (the straight box filter and unbled BC blocks turned the edge red or dark)."""
    out = tmp_path / "disc.tpk"
    bake(ArraySource(_disc(512, background)), out, _cfg(texel_format=fmt))
    for lv in range(4):
        level = extract_level(out, lv).astype(int)
        visible = level[..., 3] > 0
        edge = visible & (level[..., 3] < 255)
        assert edge.sum() > 50
        worst = 255 - level[visible][:, :3].min()
        assert worst <= (3 if fmt is TexelFormat.BC3 else 1), (lv, worst)  # bc3 colour: 5-6-5 endpoints


@pytest.mark.parametrize("mode", [AddressMode.CLAMP, AddressMode.WRAP])
@pytest.mark.parametrize("jobs", [1, 2])
def test_premultiplied_levels_and_bled_borders_agree_across_bands(
    tmp_path: Path, small_bands: None, mode: AddressMode, jobs: int
) -> None:
    """Many bands and stages: visible texels match a float64 premultiplied reference, and every
    slot (borders included, bled colour included) equals the assembled level by the address mode."""
    src = load_photo("coffee.png")[:203, :301].copy()
    y, x = np.mgrid[0:203, 0:301]
    alpha = np.clip((np.sin(x / 9.0) * np.cos(y / 13.0) * 1.6 + 0.2) * 255, 0, 255)
    alpha[(x // 40 + y // 40) % 3 == 0] = 0  # transparent squares, larger than the bleed's reach
    src[..., 3] = alpha.astype(np.uint8)
    out = tmp_path / "p.tpk"
    bake(ArraySource(src), out, _cfg(texel_format=TexelFormat.RGBA8, address_mode=mode, jobs=jobs))
    header, slots = read_slots(out)
    wrap = mode is AddressMode.WRAP
    want = premultiplied_pyramid(src, header.level_count, wrap)
    for lv in range(header.level_count):
        level = assemble(header, slots, lv)
        visible = want[lv][..., 3] > 0
        assert np.array_equal(level[..., 3] > 0, visible), lv
        diff = np.abs(level[visible].astype(int) - want[lv][visible])
        assert diff.max() <= (0 if lv == 0 else 1), lv
        tx, ty = header.tiles_in_level(lv)
        for j in range(ty):
            for i in range(tx):
                expected = ref.expected_slot(level, i, j, header.tile_size, header.border, wrap)
                assert np.array_equal(slots[(lv, i, j)], expected), (lv, i, j)


def test_transparent_texels_take_their_neighbours_colour(tmp_path: Path) -> None:
    """Left: opaque green. Right: transparent red. The stored colour of the transparent texels is
    green (near the edge by the block push-pull and dilation, farther by the row's mean), never red."""
    img = np.zeros((64, 256, 4), np.uint8)
    img[:, :41] = (0, 200, 0, 255)  # texel 41 is transparent and shares a 2x2 group with texel 40
    img[:, 41:] = (255, 0, 0, 0)
    out = tmp_path / "b.tpk"
    bake(ArraySource(img), out, _cfg(texel_format=TexelFormat.RGBA8))
    for lv in range(3):
        level = extract_level(out, lv)
        hole = level[..., 3] == 0
        assert hole.any()
        assert np.all(level[hole][:, :3] == (0, 200, 0)), lv
        assert np.all(level[~hole][:, :3] == (0, 200, 0)), lv  # no red in the mips either


def test_opaque_bakes_are_untouched(tmp_path: Path) -> None:
    """An RGBA source that is opaque bakes as it did: straight filter, no bleeding, bit for bit."""
    src = load_photo("chelsea.png")[:150, :170].copy()
    out = tmp_path / "o.tpk"
    bake(ArraySource(src), out, _cfg(texel_format=TexelFormat.RGBA8))
    header, slots = read_slots(out)
    want = ref.pyramid(src, header.level_count, srgb=True, wrap=False)
    for lv in range(header.level_count):
        assert np.abs(assemble(header, slots, lv).astype(int) - want[lv]).max() <= 1


# ---- EXIF orientation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".png", ".jpg"])
@pytest.mark.parametrize("vips", [False, True])
def test_exif_orientation_is_applied(tmp_path: Path, suffix: str, vips: bool) -> None:
    stored = load_photo("coffee.png")[:96, :160, :3].copy()  # 160 wide, 96 tall as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    path = tmp_path / f"phone{suffix}"
    Image.fromarray(stored).save(path, exif=exif.tobytes(), **({"quality": 95} if suffix == ".jpg" else {}))
    shown = np.asarray(Image.open(path).convert("RGB").transpose(Image.Transpose.ROTATE_270))
    src = open_source(path, vips_threshold=0 if vips else 1 << 30)
    assert type(src).__name__ == ("VipsSource" if vips else "PillowSource")
    out = tmp_path / "phone.tpk"
    bake(src, out, _cfg(texel_format=TexelFormat.RGBA8))
    with PackReader(out) as r:
        assert (r.header.width, r.header.height) == (96, 160)
        assert r.metadata["source_orientation"] == 6
    level0 = extract_level(out, 0)[..., :3]
    assert ref.psnr(level0, shown) >= (45 if suffix == ".jpg" else 99)
