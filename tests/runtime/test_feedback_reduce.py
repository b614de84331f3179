"""Feedback packing contract and reduction to unique pages with coverage counts."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.pack.format import PackHeader
from texstream.runtime.feedback_reduce import (
    FEEDBACK_EMPTY,
    FeedbackReducer,
    WantedPages,
    check_packable,
    pack_feedback,
    unpack_feedback,
)


def header(w: int, h: int, t: int = 64) -> PackHeader:
    return PackHeader(width=w, height=h, tile_size=t)


def test_pack_round_trip_including_extremes() -> None:
    rng = np.random.default_rng(0)
    tex = np.concatenate([[0, 254], rng.integers(0, 255, 500)])
    level = np.concatenate([[0, 15], rng.integers(0, 16, 500)])
    x = np.concatenate([[0, 1023], rng.integers(0, 1024, 500)])
    y = np.concatenate([[1023, 0], rng.integers(0, 1024, 500)])
    ids = pack_feedback(tex, level, x, y)
    assert ids.dtype == np.uint32 and not (ids == FEEDBACK_EMPTY).any()
    for got, want in zip(unpack_feedback(ids), (tex, level, x, y), strict=True):
        np.testing.assert_array_equal(got, want)


def test_pack_layout_matches_the_documented_bits() -> None:
    assert int(pack_feedback(0xAB, 0x5, 0x2CD, 0x1EF)) == (0xAB << 24) | (0x5 << 20) | (0x1EF << 10) | 0x2CD
    # What the GLSL expression computes, evaluated in uint32 arithmetic.
    t, lv, x, y = np.uint32(7), np.uint32(3), np.uint32(1000), np.uint32(513)
    u = np.uint32
    glsl = (t << u(24)) | ((lv & u(0xF)) << u(20)) | ((y & u(0x3FF)) << u(10)) | (x & u(0x3FF))
    assert int(glsl) == int(pack_feedback(7, 3, 1000, 513))


@pytest.mark.parametrize("bad", [(255, 0, 0, 0), (0, 16, 0, 0), (0, 0, 1024, 0), (0, 0, 0, -1)])
def test_pack_rejects_overflow(bad: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError, match="out of range"):
        pack_feedback(*bad)


def test_check_packable_limits() -> None:
    check_packable(header(65536, 65536, 64))  # 1024 pages a side, 11 levels
    check_packable(header(262144, 100, 256))
    with pytest.raises(ValueError, match="1024 a side"):
        check_packable(header(65537, 64, 64))
    r = FeedbackReducer()
    with pytest.raises(ValueError, match="texture id 255"):
        r.register(255, header(64, 64))


def test_reduce_counts_unique_pages_and_drops_invalid() -> None:
    r = FeedbackReducer({0: header(1000, 700), 3: header(300, 300)})  # tex 0: 16x11 pages, 5 levels
    entries = (
        [pack_feedback(0, 0, 5, 4)] * 7
        + [pack_feedback(0, 2, 1, 1)] * 3
        + [pack_feedback(3, 1, 2, 2)] * 2
        + [pack_feedback(3, 0, 4, 4)]
        + [pack_feedback(1, 0, 0, 0)] * 4  # texture 1 is not registered
        + [pack_feedback(0, 5, 0, 0)] * 2  # level past the chain
        + [pack_feedback(0, 0, 16, 0)]  # x past level 0's 16 pages
        + [pack_feedback(0, 1, 0, 6)]  # y past level 1's 6 pages
        + [np.uint32(FEEDBACK_EMPTY)] * 30
    )
    raw = np.array(entries, np.uint32)
    np.random.default_rng(1).shuffle(raw)
    res = r.reduce(raw.reshape(-1, 1))  # any shape
    assert (res.samples, res.empty, res.invalid, res.bias_levels) == (raw.size, 30, 8, 0)
    got = sorted(zip(*(a.tolist() for a in (res.pages.tex, res.pages.level, res.pages.x, res.pages.y,
                                            res.pages.count)), strict=True))  # fmt: skip
    assert got == [(0, 0, 5, 4, 7), (0, 2, 1, 1, 3), (3, 0, 4, 4, 1), (3, 1, 2, 2, 2)]
    assert res.pages.coverage == 13


def test_reduce_applies_mip_bias_and_merges() -> None:
    r = FeedbackReducer({0: header(1000, 700)})  # levels 0..4
    raw = np.array(
        [pack_feedback(0, 0, 4, 4)] * 2 + [pack_feedback(0, 0, 5, 5)] * 3 + [pack_feedback(0, 1, 2, 2)]
        + [pack_feedback(0, 0, 8, 4)] + [pack_feedback(0, 4, 0, 0)] * 5 + [pack_feedback(0, 3, 1, 1)],
        np.uint32,
    )  # fmt: skip
    res = r.reduce(raw, bias=1.75)  # floor: one level coarser
    got = sorted(zip(*(a.tolist() for a in (res.pages.level, res.pages.x, res.pages.y, res.pages.count)),
                     strict=True))  # fmt: skip
    # level 3 (1, 1) and level 4 both land on the top level (clamped)
    assert got == [(1, 2, 2, 5), (1, 4, 2, 1), (2, 1, 1, 1), (4, 0, 0, 6)]
    assert res.bias_levels == 1
    res = r.reduce(raw, bias=6.0)
    assert res.pages.level.tolist() == [4] and res.pages.count.tolist() == [raw.size]
    assert r.reduce(raw, bias=0.9).pages.count.sum() == raw.size


def test_reduce_bad_input() -> None:
    r = FeedbackReducer({0: header(1000, 700)})
    with pytest.raises(ValueError, match="mip bias"):
        r.reduce(np.zeros(4, np.uint32), bias=-1)
    with pytest.raises(ValueError, match="mip bias"):
        r.reduce(np.zeros(4, np.uint32), bias=float("nan"))
    with pytest.raises(TypeError, match="uint32"):
        r.reduce(np.zeros(4, np.float32))
    empty = r.reduce(np.full((4, 4), FEEDBACK_EMPTY, np.uint32))
    assert len(empty.pages) == 0 and empty.empty == 16
    assert len(r.reduce(np.zeros(0, np.uint32)).pages) == 0


def test_unregister_makes_entries_invalid() -> None:
    r = FeedbackReducer({0: header(1000, 700)})
    raw = pack_feedback(np.zeros(3), np.zeros(3), np.arange(3), np.zeros(3))
    assert len(r.reduce(raw).pages) == 3
    r.unregister(0)
    res = r.reduce(raw)
    assert len(res.pages) == 0 and res.invalid == 3


def test_wanted_pages_container() -> None:
    w = WantedPages.from_tiles([(0, 1, 2, 3, 4), (1, 0, 0, 0, 1)])
    assert len(w) == 2 and w.coverage == 5 and w.keys().shape == (2,)
    with pytest.raises(ValueError, match="differ in length"):
        WantedPages(np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(3))


def test_reduce_large_buffer_is_exact() -> None:
    """A full feedback target's worth of random ids reduces to exactly np.unique's answer."""
    rng = np.random.default_rng(2)
    r = FeedbackReducer({i: header(8192, 8192) for i in range(4)})  # 128x128 pages, 8 levels
    tex = rng.integers(0, 4, 240 * 135)
    level = rng.integers(0, 3, tex.size)
    x = rng.integers(0, 128, tex.size) >> level
    y = rng.integers(0, 128, tex.size) >> level
    raw = pack_feedback(tex, level, x, y)
    res = r.reduce(raw)
    u, c = np.unique(raw, return_counts=True)
    np.testing.assert_array_equal(pack_feedback(res.pages.tex, res.pages.level, res.pages.x, res.pages.y), u)
    np.testing.assert_array_equal(res.pages.count, c)
