"""Mip filtering: exact transfer tables, the 2x2 box against a float64 reference, band independence."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.bake.mips import (
    BLEED_ROWS,
    LevelRows,
    Transfer,
    band_levels,
    bleed,
    decode_table,
    next_window,
    reduce_level,
)
from texstream.pack import AddressMode

from . import reference as ref

MODES = [AddressMode.CLAMP, AddressMode.WRAP]


def test_decode_table_is_the_exact_srgb_curve() -> None:
    codes = np.arange(256, dtype=np.uint8)
    np.testing.assert_allclose(decode_table(True), ref.srgb_decode(codes), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(decode_table(False), codes / 255.0, rtol=1e-6)


@pytest.mark.parametrize("srgb", [True, False])
def test_every_code_survives_decode_encode(srgb: bool) -> None:
    codes = np.arange(256, dtype=np.uint8)
    rgba = np.stack([codes, codes[::-1], codes, codes[::-1]], axis=-1).reshape(16, 16, 4)
    t = Transfer(srgb=srgb)
    assert np.array_equal(t.encode(t.decode(rgba)), rgba)


@pytest.mark.parametrize("srgb", [True, False])
def test_encode_rounds_like_the_formula(srgb: bool) -> None:
    rng = np.random.default_rng(3)
    lin = rng.random((64, 256, 4), dtype=np.float32)
    lin[0, :8] = [[0, 0, 0, 0], [1, 1, 1, 1], [-0.5, 2.0, np.nan, 0.5]] + [[0.25] * 4] * 5
    got = Transfer(srgb=srgb).encode(lin).astype(int)
    want = ref.to_u8(np.nan_to_num(lin.astype(np.float64)), srgb).astype(int)
    diff = np.abs(got - want)
    assert diff.max() <= 1
    assert (diff > 0).mean() < 0.01  # off by one only within 2^-12 of a rounding boundary
    assert got[0, 2, 0] == 0 and got[0, 2, 1] == 255 and got[0, 2, 2] == 0  # clipped, NaN -> 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(6, 8), (7, 9), (1, 5), (5, 1), (1, 1), (2, 3)])
@pytest.mark.parametrize("alpha", [False, True])
def test_reduce_matches_float64_reference(mode: AddressMode, shape: tuple[int, int], alpha: bool) -> None:
    rng = np.random.default_rng(sum(shape))
    img = rng.integers(0, 256, shape + (4,), dtype=np.uint8)
    if not alpha:
        img[..., 3] = 255
    t = Transfer(srgb=True, alpha=alpha)
    want = ref.next_level(ref.to_linear(img, True), mode is AddressMode.WRAP)
    got_u8 = reduce_level(img, t, mode)  # from 8-bit texels (pair table)
    got_f = reduce_level(t.decode(img), t, mode)  # from float32 linear
    np.testing.assert_allclose(got_u8, want, atol=2e-6)
    np.testing.assert_allclose(got_f, want, atol=2e-6)


def test_reduce_keeps_alpha_linear_and_colour_in_linear_light() -> None:
    img = np.zeros((2, 2, 4), np.uint8)
    img[0, 0] = (255, 255, 255, 255)  # one white texel, three black; alpha 255,0,0,0
    out = reduce_level(img, Transfer(srgb=True, alpha=True))
    assert out[0, 0, 0] == pytest.approx(0.25)  # linear mean, so sRGB ~137, not 64
    assert out[0, 0, 3] == pytest.approx(0.25)
    assert Transfer(srgb=True).encode(out)[0, 0, 0] == 137


@pytest.mark.parametrize("mode", MODES)
def test_bands_reproduce_the_whole_level_bit_for_bit(mode: AddressMode) -> None:
    """Rows of later levels made from a band of rows equal those made from the whole image."""
    rng = np.random.default_rng(5)
    h, w = 77, 53
    img = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    t = Transfer(srgb=True, alpha=True)

    def dims(level: int) -> tuple[int, int]:
        return max(1, -(-w // (1 << level))), max(1, -(-h // (1 << level)))

    levels = [img]
    for _ in range(3):
        levels.append(reduce_level(levels[-1], t, mode))
    for lo, hi in [(0, 24), (16, 48), (40, 77), (8, 77)]:

        def row_zero(level: int) -> np.ndarray:
            return levels[level][0]

        for lr in band_levels(LevelRows(0, lo, hi, img[lo:hi]), 3, dims, t, mode, row_zero, fuse=False):
            assert np.array_equal(lr.data, levels[lr.level][lr.lo : lr.hi]), (lo, hi, lr.level)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transfer", [Transfer(True, True), Transfer(True, False), Transfer(False, True)])
def test_the_fused_first_reductions_give_the_codes_and_floats_of_the_levels_one_by_one(
    mode: AddressMode, transfer: Transfer
) -> None:
    """With `fuse` (the compiled pass that makes a band's next level as 8-bit codes and the one after
    in one go), every level equals the level made one by one from the whole image: the middle level
    as its `Transfer.encode` codes, the others as float32, bit for bit; where the pass does not apply
    (an odd edge's extra row, no helper) the levels come as floats, equal too."""
    from texstream.native import reduce_twice_rgba8

    if reduce_twice_rgba8() is None:
        pytest.skip("texstream's compiled helper is not built")
    rng = np.random.default_rng(9)
    for h, w in ((77, 53), (64, 1030), (40, 7)):
        img = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
        if not transfer.alpha:
            img[..., 3] = 255

        def dims(level: int, h: int = h, w: int = w) -> tuple[int, int]:
            return max(1, -(-w // (1 << level))), max(1, -(-h // (1 << level)))

        levels = [img]
        for _ in range(3):
            levels.append(reduce_level(levels[-1], transfer, mode))
        fused = 0
        for lo, hi in [(0, 24), (16, 40), (8, h), (0, h)]:

            def row_zero(level: int, levels: list = levels) -> np.ndarray:
                return levels[level][0]

            got = list(band_levels(LevelRows(0, lo, hi, img[lo:hi]), 3, dims, transfer, mode, row_zero))
            assert [lr.level for lr in got] == [0, 1, 2, 3]
            for lr in got:
                want = levels[lr.level][lr.lo : lr.hi]
                if lr.level == 1 and lr.data.dtype == np.uint8:
                    want, fused = transfer.encode(np.ascontiguousarray(want)), fused + 1
                assert lr.data.dtype == want.dtype, (h, w, lo, hi, lr.level)
                assert np.array_equal(lr.data, want), (h, w, lo, hi, lr.level)
        assert fused, "the fused pass never ran"


def test_next_window() -> None:
    assert next_window(0, 10, 21) == (0, 5)
    assert next_window(4, 21, 21) == (2, 11)  # the odd last row pairs with the address mode's row
    assert next_window(3, 9, 40) == (2, 4)  # only rows whose two sources are present


# ---- alpha: premultiplied filter and bleeding ----------------------------------------------------------
def test_premultiplied_reduce_ignores_the_colour_of_transparent_texels() -> None:
    img = np.zeros((2, 4, 4), np.uint8)
    img[..., 0] = 255  # red everywhere, but transparent ...
    img[0, 0] = (255, 255, 255, 255)  # ... except one white texel in the first footprint
    img[1, 3] = (255, 255, 255, 64)  # a faint white one in the second
    out = reduce_level(img, Transfer(srgb=True, alpha=True, premultiplied=True))
    np.testing.assert_allclose(out[0, 0], [1.0, 1.0, 1.0, 0.25], rtol=1e-6)
    np.testing.assert_allclose(out[0, 1], [1.0, 1.0, 1.0, 64 / 255 / 4], rtol=1e-6)
    straight = reduce_level(img, Transfer(srgb=True, alpha=True))
    assert straight[0, 0, 1] < 0.3  # the straight mean: pink
    img[..., 3] = 0
    assert not reduce_level(img, Transfer(srgb=True, alpha=True, premultiplied=True))[..., :3].any()


@pytest.mark.parametrize("mode", [AddressMode.CLAMP, AddressMode.WRAP])
def test_premultiplied_reduce_is_the_straight_one_on_opaque_texels(mode: AddressMode) -> None:
    """Opaque bands take the straight path: both must give the same bits, or bands would disagree."""
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (37, 29, 4), dtype=np.uint8)
    img[..., 3] = 255
    pre, straight = Transfer(srgb=True, premultiplied=True), Transfer(srgb=True, alpha=False)
    a, b = reduce_level(img, pre, mode), reduce_level(img, straight, mode)
    assert np.array_equal(a, b)
    assert np.array_equal(reduce_level(a, pre, mode), reduce_level(b, straight, mode))


def test_bleed_fills_from_the_group_then_the_block_then_the_grid() -> None:
    t = Transfer(srgb=False, premultiplied=True)
    enc = np.zeros((8, 64, 4), np.uint8)
    enc[:, :, :3] = (255, 0, 0)  # transparent red
    enc[0, 0] = (0, 100, 0, 255)  # group (0, 0) has a visible texel
    enc[2, 2] = (0, 0, 100, 255)  # block (0, 0) holds both; group (1, 1) has the blue one
    rows = enc.copy()
    filled = bleed(enc, rows, 0, t)
    assert filled == 8 * 64 - 2
    assert tuple(enc[1, 1, :3]) == (0, 100, 0) and tuple(enc[3, 3, :3]) == (0, 0, 100)
    assert tuple(enc[0, 2, :3]) == (0, 50, 50)  # group (0, 1) is empty: the block's mean
    assert tuple(enc[4, 4, :3]) == (0, 50, 50)  # an empty block next to it: dilated
    assert not np.any(enc[..., 0] == 255) and np.all(enc[..., 3][rows[..., 3] == 0] == 0)


def test_bleed_does_not_depend_on_where_the_rows_are_cut() -> None:
    """Rows filled with at least BLEED_ROWS rows of context either side equal the whole level's."""
    rng = np.random.default_rng(9)
    n, w = 160, 90
    rows = rng.integers(0, 256, (n, w, 4), dtype=np.uint8)
    y, x = np.mgrid[0:n, 0:w]
    rows[..., 3] = np.where(((x // 23) + (y // 29)) % 3 == 0, rows[..., 3], 0)  # wide transparent areas
    t = Transfer(srgb=True, premultiplied=True)
    whole = rows.copy()
    bleed(whole, rows, 0, t)
    for lo, hi in ((20, 60), (44, 100), (100, 160)):
        a, z = max(0, lo - BLEED_ROWS), min(n, hi + BLEED_ROWS)
        part = rows[a:z].copy()
        bleed(part, rows[a:z], a, t)
        assert np.array_equal(part[lo - a : hi - a], whole[lo:hi]), (lo, hi)


@pytest.mark.parametrize("srgb", [True, False])
def test_encode_table_is_the_formula_on_every_bin(srgb: bool) -> None:
    """The table built from the bins between 2^-14 and 1 only equals the formula on all 2^20 bins."""
    from texstream.bake.mips import _ENC_SHIFT, _encode_table, linear_to_srgb

    bins = np.arange(1 << (32 - _ENC_SHIFT), dtype=np.uint64)
    mid = ((bins << _ENC_SHIFT) + (1 << (_ENC_SHIFT - 1))).astype(np.uint32).view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        x = np.clip(np.nan_to_num(mid.astype(np.float64), nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
    want = np.rint((linear_to_srgb(x) if srgb else x) * 255.0)
    want[bins >= (1 << (31 - _ENC_SHIFT))] = 0  # negative
    want[np.isnan(mid)] = 0
    assert np.array_equal(_encode_table(srgb), want.astype(np.uint8))


@pytest.mark.parametrize("mode", list(AddressMode))
def test_the_compiled_reduction_gives_numpys_bits(mode: AddressMode) -> None:
    """ts_mip_reduce_rgba8 and ts_mip_reduce_f32 (_native.c) and the numpy path agree bit for bit: 8-bit and
    float rows, sRGB and linear, real alpha and opaque, odd and even widths."""
    from texstream.bake import mips
    from texstream.native import reduce_f32, reduce_rgba8

    if reduce_rgba8() is None or reduce_f32() is None:
        pytest.skip("texstream's compiled helper is not built")
    rng = np.random.default_rng(3)
    try:
        for m, w in ((2, 1), (2, 3), (4, 7), (16, 64), (6, 333), (2, 1031)):  # 1031: vector body and tail
            rows = rng.integers(0, 256, (m, w, 4), np.uint8)
            opaque = rows.copy()
            opaque[..., 3] = 255
            linear = rng.random((m, w, 4), np.float32) * np.float32(1.5) - np.float32(0.25)
            for transfer in (Transfer(True, True), Transfer(True, False), Transfer(False, True)):
                for r in (rows, opaque, rows[:, ::-1], linear, linear[:, ::-1]):  # reversed: not contiguous
                    mips.use_native_reduce(True)
                    native = transfer.reduce(r, None, mode)
                    mips.use_native_reduce(False)
                    numpy = transfer.reduce(r, None, mode)
                    assert np.array_equal(native.view(np.uint32), numpy.view(np.uint32)), (m, w, transfer)
    finally:
        mips.use_native_reduce(True)


def test_the_compiled_encoding_gives_numpys_bits() -> None:
    """ts_mip_encode_f32 (_native.c) and the numpy path of `Transfer.encode` agree bit for bit on every
    kind of float32: rounding ties of four-texel means, values near each code's edges, NaN,
    infinities, negatives, subnormals and random bits; sRGB and linear, alpha and opaque."""
    from texstream.bake import mips
    from texstream.native import encode_f32

    if encode_f32() is None:
        pytest.skip("texstream's compiled helper is not built")
    rng = np.random.default_rng(11)
    ties = np.arange(1021, dtype=np.float32) / np.float32(1020)
    edges = (np.arange(256, dtype=np.float32)[:, None] + np.float32([-0.5, 0.5])) / np.float32(255)
    edges = np.concatenate([edges.ravel(), np.nextafter(edges.ravel(), np.float32(2)), np.nextafter(edges.ravel(), -1)])
    special = np.float32([np.nan, np.inf, -np.inf, -0.0, 0.0, -1e-30, 1e-45, 1e-39, 1.0, 1.0000001, 3e38])
    random_bits = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values = np.concatenate([ties, edges.astype(np.float32), special, random_bits, rng.random(4096, np.float32)])
    values = values[: values.size // 4 * 4]
    try:
        for width in (values.size // 4, 7):
            rows = values[: values.size // (4 * width) * 4 * width].reshape(-1, width, 4)
            for transfer in (
                Transfer(True, True),
                Transfer(True, False),
                Transfer(False, True),
                Transfer(False, False),
            ):
                for r in (rows, rows[:, ::-1]):  # reversed: not contiguous
                    mips.use_native_reduce(True)
                    with np.errstate(invalid="ignore", over="ignore"):
                        native = transfer.encode(r)
                    mips.use_native_reduce(False)
                    with np.errstate(invalid="ignore", over="ignore"):
                        numpy = transfer.encode(r)
                    assert np.array_equal(native, numpy), (width, transfer)
    finally:
        mips.use_native_reduce(True)
