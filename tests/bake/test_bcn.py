"""Block compression of slots, checked with texture2ddecoder (an independent decoder).

Quality floors are what the chosen encoders measured on these slots, less 0.5 dB: a lower figure
means an encoder or its settings got worse (docs/BENCHMARKS.md has the full comparison).
"""

from __future__ import annotations

import numpy as np
import pytest

from texstream.apps.bench_encoders import make_icon, make_normals
from texstream.bake import encoders
from texstream.bake.bcn import CHOSEN, encode_slot, raw_size
from texstream.pack import PackHeader, TexelFormat

from . import reference as ref
from .conftest import PHOTOS, decode, load_photo

S = 136
BLOCK_FORMATS = [f for f in TexelFormat if f is not TexelFormat.RGBA8]

# (format, bc7 quality) -> PSNR floor per photograph over 6 slots: BC1/BC3/BC7 on R, G, B; BC4 on R;
# BC5 on R, G. Measured: BC1 34.9 / 34.9 / 37.3, BC4 41.7 / 42.6 / 44.6, BC5 41.7 / 42.4 / 44.8,
# BC7 fast 40.4 / 39.5 / 43.6, balanced 43.3 / 42.3 / 44.5, normal 44.2 / 42.7 / 45.3, slow 44.7 / 42.9
# / 45.5 (etcpak, the encoder before: BC1 ~2.2 dB, BC4/BC5 ~2.5 dB and BC7 normal ~1.4 dB lower).
PHOTO_FLOORS: dict[tuple[TexelFormat, str], tuple[float, float, float]] = {
    (TexelFormat.BC1, "normal"): (34.4, 34.4, 36.8),
    (TexelFormat.BC3, "normal"): (34.4, 34.4, 36.8),
    (TexelFormat.BC4, "normal"): (41.2, 42.0, 44.1),
    (TexelFormat.BC5, "normal"): (41.1, 41.8, 44.3),
    (TexelFormat.BC7, "fast"): (39.9, 39.0, 43.0),
    (TexelFormat.BC7, "balanced"): (42.8, 41.8, 44.0),
    (TexelFormat.BC7, "normal"): (43.6, 42.1, 44.8),
    (TexelFormat.BC7, "slow"): (44.2, 42.4, 45.0),
}
# (format, bc7 quality) -> (colour where alpha > 0, alpha) on the icon's four corner slots.
# Measured: BC1 37.2, BC3 37.2 / 46.6, BC7 fast 40.0 / 46.3, balanced and normal 48.7 / 45.5 (the same
# alpha profile), slow 48.8 / 45.5 (etcpak: BC1/BC3 colour 25.4, BC7 alpha 40.3).
ICON_FLOORS: dict[tuple[TexelFormat, str], tuple[float, float | None]] = {
    (TexelFormat.BC1, "normal"): (36.6, None),
    (TexelFormat.BC3, "normal"): (36.6, 46.0),
    (TexelFormat.BC7, "fast"): (39.5, 45.8),
    (TexelFormat.BC7, "balanced"): (48.2, 45.0),
    (TexelFormat.BC7, "normal"): (48.2, 45.0),
    (TexelFormat.BC7, "slow"): (48.3, 45.0),
}
_CHANNELS = {TexelFormat.BC4: slice(0, 1), TexelFormat.BC5: slice(0, 2)}


def _slots(name: str, count: int = 6) -> list[np.ndarray]:
    img = load_photo(name)
    h, w = img.shape[:2]
    ys = np.linspace(0, h - S, count).astype(int)
    xs = np.linspace(0, w - S, count).astype(int)
    return [np.ascontiguousarray(img[y : y + S, x : x + S]) for y, x in zip(ys, xs, strict=True)]


def _corner_slots(img: np.ndarray) -> list[np.ndarray]:
    h, w = img.shape[:2]
    return [np.ascontiguousarray(img[y : y + S, x : x + S]) for y in (0, h - S) for x in (0, w - S)]


def _round_trip(slots: list[np.ndarray], fmt: TexelFormat, quality: str = "normal", **kw: bool) -> np.ndarray:
    return np.stack([decode(encode_slot(s, fmt, bc7_quality=quality, **kw), fmt, S) for s in slots])


@pytest.mark.parametrize("fmt", list(TexelFormat))
def test_raw_size_matches_the_pack_header(fmt: TexelFormat) -> None:
    slot = _slots("coffee.png", 1)[0]
    data = encode_slot(slot, fmt, bc7_quality="fast")
    assert (
        len(data) == raw_size(fmt, S) == PackHeader(width=300, height=300, texel_format=fmt, srgb=False).tile_raw_size
    )


@pytest.mark.parametrize("side", [4, 72, 264])
@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_every_slot_size_round_trips_at_its_exact_length(fmt: TexelFormat, side: int) -> None:
    img = load_photo("chelsea.png")
    slot = np.ascontiguousarray(img[:side, :side])
    data = encode_slot(slot, fmt, bc7_quality="fast")
    assert len(data) == raw_size(fmt, side)
    got = decode(data, fmt, side)
    ch = _CHANNELS.get(fmt, slice(0, 3))
    assert ref.psnr(got[..., ch], slot[..., ch]) >= 30


@pytest.mark.parametrize(("fmt", "quality"), list(PHOTO_FLOORS))
def test_quality_floors_on_photographs(fmt: TexelFormat, quality: str) -> None:
    ch = _CHANNELS.get(fmt, slice(0, 3))
    for name, floor in zip(PHOTOS, PHOTO_FLOORS[(fmt, quality)], strict=True):
        slots = _slots(name)
        got = _round_trip(slots, fmt, quality)
        assert ref.psnr(got[..., ch], np.stack(slots)[..., ch]) >= floor, name


@pytest.mark.parametrize(("fmt", "quality"), list(ICON_FLOORS))
def test_icon_colour_where_visible_and_alpha(fmt: TexelFormat, quality: str) -> None:
    slots = _corner_slots(make_icon())
    src = np.stack(slots)
    got = _round_trip(slots, fmt, quality)
    seen = src[..., 3] > 0
    colour_floor, alpha_floor = ICON_FLOORS[(fmt, quality)]
    assert ref.psnr(got[..., :3][seen], src[..., :3][seen]) >= colour_floor
    if alpha_floor is not None:
        assert ref.psnr(got[..., 3], src[..., 3]) >= alpha_floor


def test_bc5_keeps_a_normal_map() -> None:
    slots = _corner_slots(make_normals(2 * S))
    got = _round_trip(slots, TexelFormat.BC5)
    assert ref.psnr(got[..., :2], np.stack(slots)[..., :2]) >= 46.2  # measured 46.7


@pytest.mark.parametrize("quality", encoders.BC7_QUALITIES)
@pytest.mark.parametrize("fmt", [TexelFormat.BC3, TexelFormat.BC7])
def test_opaque_slots_decode_alpha_255(fmt: TexelFormat, quality: str) -> None:
    # ispc's BC7 mode 6 alone leaves alpha at 254 on about half the texels of ultrafast's blocks.
    got = _round_trip(_slots("astronaut.png"), fmt, quality)
    assert (got[..., 3] == 255).all()


def test_bc7_without_alpha_encodes_opaque_and_with_alpha_keeps_it() -> None:
    slot = _slots("astronaut.png", 1)[0].copy()
    slot[..., 3] = np.arange(S, dtype=np.uint8)[None, :] * 2
    assert (_round_trip([slot], TexelFormat.BC7, alpha=False)[..., 3] == 255).all()
    kept = _round_trip([slot], TexelFormat.BC7)[0]
    assert ref.psnr(kept[..., 3], slot[..., 3]) >= 45


def test_bc3_keeps_an_alpha_ramp() -> None:
    slot = _slots("astronaut.png", 1)[0].copy()
    slot[..., 3] = np.arange(S, dtype=np.uint8)[None, :] * 2
    bc3 = decode(encode_slot(slot, TexelFormat.BC3), TexelFormat.BC3, S)
    assert ref.psnr(bc3[..., 3], slot[..., 3]) >= 45


def test_bc7_levels_order_by_quality() -> None:
    slots = _slots("chelsea.png", 2)
    q = {
        p: ref.psnr(_round_trip(slots, TexelFormat.BC7, p)[..., :3], np.stack(slots)[..., :3])
        for p in encoders.BC7_QUALITIES
    }
    assert q["fast"] < q["balanced"] < q["normal"] <= q["slow"] + 0.05


def test_balanced_bc7_is_fast_where_one_line_fits_and_normal_where_it_does_not() -> None:
    """Block by block, the balanced level's bytes are the fast level's (ispc ultrafast) where the
    block's colours lie near one line, and the normal level's (veryfast) where they stray from it."""
    slots = _slots("astronaut.png", 3) + [_slots("chelsea.png", 1)[0]]
    picked_somewhere = kept_somewhere = False
    for slot in slots:
        blocks = slot.reshape(S // 4, 4, S // 4, 4, 4).transpose(0, 2, 1, 3, 4).reshape(-1, 4, 4, 4)
        picked = encoders.off_axis_energy(blocks) > encoders.ISPC_BC7_REFINE["balanced"][1]
        got = np.frombuffer(encode_slot(slot, TexelFormat.BC7, bc7_quality="balanced"), np.uint8).reshape(-1, 16)
        fast = np.frombuffer(encode_slot(slot, TexelFormat.BC7, bc7_quality="fast"), np.uint8).reshape(-1, 16)
        normal = np.frombuffer(encode_slot(slot, TexelFormat.BC7, bc7_quality="normal"), np.uint8).reshape(-1, 16)
        np.testing.assert_array_equal(got[picked], normal[picked])
        np.testing.assert_array_equal(got[~picked], fast[~picked])
        picked_somewhere |= bool(picked.any())
        kept_somewhere |= bool((~picked).any())
    assert picked_somewhere and kept_somewhere


def test_off_axis_energy_is_what_no_single_line_can_encode() -> None:
    rng = np.random.default_rng(5)
    t = rng.uniform(0, 1, (200, 16, 1))
    a, b = rng.uniform(0, 255, (2, 200, 1, 3))
    on_line = np.round(a + t * (b - a))  # colours on one segment, rounded to 8 bits
    off_line = rng.integers(0, 256, (200, 16, 3)).astype(np.float64)
    for rgb in (on_line, off_line):
        blocks = np.concatenate([rgb, np.full((200, 16, 1), 255.0)], axis=2).astype(np.uint8).reshape(200, 4, 4, 4)
        got = encoders.off_axis_energy(blocks)
        centred = rgb - rgb.mean(axis=1, keepdims=True)
        eig = np.linalg.eigvalsh(np.einsum("nki,nkj->nij", centred, centred))
        expected = eig[:, 0] + eig[:, 1]  # the variance off the principal axis
        assert np.all(got >= expected - 1e-6 * (1 + expected))  # a Rayleigh quotient: never under the truth
        assert np.all(got <= eig.sum(axis=1) + 1e-6 * (1 + expected))  # nor over the whole variance
        if rgb is on_line:  # one axis dominates: the power iterations converge, rounding is all that is left
            np.testing.assert_allclose(got, expected, atol=0.5)
            assert got.max() < 16 * 0.5  # under half a step squared a texel
        else:  # noise: no axis dominates, far over the threshold either way
            assert got.min() > 10 * encoders.ISPC_BC7_REFINE["balanced"][1]
    flat = np.full((3, 4, 4, 4), 77, np.uint8)
    flat[1, ..., 0] = np.arange(16, dtype=np.uint8).reshape(4, 4) * 16  # a ramp in red alone: one line
    flat[2, ..., 1] = np.arange(16, dtype=np.uint8).reshape(4, 4) * 16  # in green alone, the start axis not red
    assert list(encoders.off_axis_energy(flat)) == [0.0, 0.0, 0.0]


def test_force_opaque_bc7_sets_only_mode_6_alpha_and_p_bits() -> None:
    mode6 = bytes([0x40]) + bytes(15)
    mode1 = bytes([0x02]) + bytes(15)
    out = np.frombuffer(encoders.force_opaque_bc7(mode6 + mode1), np.uint8).reshape(2, 16)
    bits = int.from_bytes(out[0].tobytes(), "little")
    assert (bits >> 49) & 0x3FFF == 0x3FFF and (bits >> 63) & 0b11 == 0b11  # A0 = A1 = 127, P0 = P1 = 1
    assert bits & ((1 << 49) - 1) == 0x40 and bits >> 65 == 0  # mode, R, G, B and indices untouched
    assert out[1].tobytes() == mode1
    assert decode(out[0].tobytes(), TexelFormat.BC7, 4)[..., 3].min() == 255


def test_every_block_format_has_a_chosen_encoder_that_releases_the_gil() -> None:
    assert set(CHOSEN) == set(BLOCK_FORMATS)
    assert all(encoders.ENCODERS[(f, name)].releases_gil for f, name in CHOSEN.items())


@pytest.mark.parametrize(("fmt", "name"), [k for k in encoders.ENCODERS if k[1] != CHOSEN[k[0]]])
def test_candidate_encoders_make_decodable_blocks(fmt: TexelFormat, name: str) -> None:
    """The candidates `bench bake` compares (etcpak, quicktex) stay working through the same interface."""
    pytest.importorskip(name)
    slot = _slots("coffee.png", 1)[0]
    out = encoders.ENCODERS[(fmt, name)].encode(slot, "fast", True, True)
    assert len(out) >= raw_size(fmt, S)
    got = decode(bytes(out[: raw_size(fmt, S)]), fmt, S)
    ch = _CHANNELS.get(fmt, slice(0, 3))
    assert ref.psnr(got[..., ch], slot[..., ch]) >= 30


def test_rgba8_is_the_slot_bytes() -> None:
    slot = _slots("coffee.png", 1)[0]
    assert encode_slot(slot, TexelFormat.RGBA8) == slot.tobytes()


@pytest.mark.parametrize(
    ("slot", "match"),
    [
        (np.zeros((136, 136, 3), np.uint8), r"\(S, S, 4\) uint8"),
        (np.zeros((136, 136, 4), np.float32), r"\(S, S, 4\) uint8"),
        (np.zeros((136, 132, 4), np.uint8), "square"),
        (np.zeros((130, 130, 4), np.uint8), "multiple of 4"),
        (np.zeros((136, 272, 4), np.uint8)[:, ::2], "C-contiguous"),
        ([[0]], r"\(S, S, 4\) uint8"),
    ],
)
def test_bad_slots_are_rejected_before_an_encoder_sees_them(slot: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_slot(slot, TexelFormat.BC1)  # type: ignore[arg-type]


def test_unknown_bc7_quality_is_refused() -> None:
    slot = _slots("chelsea.png", 1)[0]
    with pytest.raises(ValueError, match="bc7 quality must be one of fast, balanced, normal, slow, got 'ultra'"):
        encode_slot(slot, TexelFormat.BC7, bc7_quality="ultra")


@pytest.mark.parametrize("fmt", list(TexelFormat))
@pytest.mark.parametrize("alpha", [True, False])
def test_a_stack_of_slots_encodes_as_each_slot_alone(fmt: TexelFormat, alpha: bool) -> None:
    """`encode_slots` (one encoder call for a whole tile row) gives `encode_slot`'s bytes slot by
    slot, BC7's opaque and translucent slots (two profiles) interleaved in their order."""
    from texstream.bake.bcn import encode_slots

    slots = _slots("coffee.png", 5) + _corner_slots(make_icon(300))
    stack = np.ascontiguousarray(np.stack(slots))
    assert (stack[..., 3].min(axis=(1, 2)) < 255).any() and (stack[..., 3].min(axis=(1, 2)) == 255).any()
    for quality in ("fast", "balanced", "normal") if fmt is TexelFormat.BC7 else ("normal",):
        one_by_one = b"".join(encode_slot(s, fmt, bc7_quality=quality, alpha=alpha) for s in slots)
        assert encode_slots(stack, fmt, bc7_quality=quality, alpha=alpha) == one_by_one


def test_encode_slots_checks_its_input() -> None:
    from texstream.bake.bcn import encode_slots

    with pytest.raises(ValueError, match="n, S, S, 4"):
        encode_slots(np.zeros((8, 8, 4), np.uint8), TexelFormat.BC1)
    with pytest.raises(ValueError, match="square"):
        encode_slots(np.zeros((2, 8, 12, 4), np.uint8), TexelFormat.BC1)
    with pytest.raises(ValueError, match="C-contiguous"):
        encode_slots(np.zeros((2, 8, 16, 4), np.uint8)[:, :, ::2], TexelFormat.BC1)
    assert encode_slots(np.zeros((0, 8, 8, 4), np.uint8), TexelFormat.BC1) == b""


@pytest.mark.parametrize("fmt", [TexelFormat.BC1, TexelFormat.BC3, TexelFormat.BC4, TexelFormat.BC5])
def test_slots_cut_from_an_encoded_surface_are_the_slots_encoded(fmt: TexelFormat) -> None:
    """The bake encodes a band's tile rows as one surface and cuts each slot's blocks out of the
    grid (neighbouring slots share their border blocks): the bytes of `encode_slot` on each slot."""
    from texstream.bake.bcn import encode_surface, encodes_blocks_alone

    assert encodes_blocks_alone(fmt)
    tile, border = 64, 4
    surface = np.ascontiguousarray(load_photo("coffee.png")[: 2 * tile + 2 * border, : 3 * tile + 2 * border])
    grid = encode_surface(surface, fmt)
    s, bt, bs = tile + 2 * border, tile // 4, (tile + 2 * border) // 4
    for y in range(2):
        for x in range(3):
            slot = np.ascontiguousarray(surface[y * tile : y * tile + s, x * tile : x * tile + s])
            blocks = grid[y * bt : y * bt + bs, x * bt : x * bt + bs]
            assert np.ascontiguousarray(blocks).tobytes() == encode_slot(slot, fmt), (x, y)


@pytest.mark.parametrize("fmt", [TexelFormat.BC1, TexelFormat.BC3, TexelFormat.BC4, TexelFormat.BC5])
def test_a_surfaces_first_columns_encode_in_place(fmt: TexelFormat) -> None:
    """`columns`: the blocks of the first columns of each row, read from the wider rows in place,
    are the blocks of those columns copied out."""
    from texstream.bake.bcn import encode_surface

    rows = np.ascontiguousarray(load_photo("coffee.png")[:40, :203])
    for columns in (4, 100, 200):
        copied = encode_surface(np.ascontiguousarray(rows[:, :columns]), fmt)
        assert np.array_equal(encode_surface(rows, fmt, columns), copied), columns
    with pytest.raises(ValueError, match="columns must be in 1..203"):
        encode_surface(rows, fmt, 204)
    with pytest.raises(ValueError, match="multiples of 4"):
        encode_surface(rows, fmt, 6)


def test_encode_surface_checks_its_input() -> None:
    from texstream.bake.bcn import encode_surface, encodes_blocks_alone

    assert not encodes_blocks_alone(TexelFormat.BC7) and not encodes_blocks_alone(TexelFormat.RGBA8)
    with pytest.raises(ValueError, match="multiples of 4"):
        encode_surface(np.zeros((8, 6, 4), np.uint8), TexelFormat.BC1)
    with pytest.raises(ValueError, match="C-contiguous"):
        encode_surface(np.zeros((8, 16, 4), np.uint8)[:, ::2], TexelFormat.BC1)
    with pytest.raises(ValueError, match="block by block"):
        encode_surface(np.zeros((8, 8, 4), np.uint8), TexelFormat.BC7)


def test_bench_reports_each_bc7_level_it_is_asked_for(capsys: pytest.CaptureFixture) -> None:
    from texstream.apps.bench_encoders import bench_bc7_presets, print_bc7_presets

    rows = bench_bc7_presets(1, quick=True, side=128, levels=("fast", "balanced"))
    assert [r["level"] for r in rows] == ["fast", "balanced"]
    for r in rows:
        assert r["bake_cores"] == 1 and r["bake_size"] == 128 and r["mpix_s_1core"] > 0 and r["bake_mpix_s"] > 0
    fast, balanced = rows
    assert all(balanced[f"db_{p[:-4]}"] > fast[f"db_{p[:-4]}"] for p in PHOTOS)
    assert abs(balanced["db_astronaut"] - 43.14) < 0.3  # the whole photo, every 136² slot (docs/BENCHMARKS.md)
    print_bc7_presets(rows)
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["level", "1", "core", "bake", "astronaut", "coffee", "chelsea"]
    assert [line.split()[0] for line in out[2:]] == ["fast", "balanced"]


def test_the_bench_decodes_every_format_it_encodes() -> None:
    """`bench bake`'s quality column decodes each format's blocks (a format without a decoder there
    would stop the whole bench)."""
    from texstream.apps import bench_encoders as be

    side = be.SLOT
    y, x = np.mgrid[0:side, 0:side] * 255 // (side - 1)  # smooth gradients: every format keeps them well
    img = np.stack([x, y, (x + y) // 2, np.full_like(x, 255)], -1).astype(np.uint8)
    for enc in be.ENCODERS.values():
        if enc.fmt is TexelFormat.BC7 or not be._available(enc):
            continue  # (BC7's levels have their own tests)
        colour, _alpha = be.quality(enc, img)
        assert colour > 20, (enc.fmt, colour)
