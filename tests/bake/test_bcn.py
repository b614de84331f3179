"""Block compression of slots, checked with texture2ddecoder (an independent decoder)."""

from __future__ import annotations

import numpy as np
import pytest

from texstream.bake.bcn import encode_slot, raw_size
from texstream.pack import PackHeader, TexelFormat

from . import reference as ref
from .conftest import PHOTOS, decode, load_photo

S = 136


def _slots(name: str, count: int = 6) -> list[np.ndarray]:
    img = load_photo(name)
    h, w = img.shape[:2]
    ys = np.linspace(0, h - S, count).astype(int)
    xs = np.linspace(0, w - S, count).astype(int)
    return [np.ascontiguousarray(img[y : y + S, x : x + S]) for y, x in zip(ys, xs, strict=True)]


@pytest.mark.parametrize("fmt", list(TexelFormat))
def test_raw_size_matches_the_pack_header(fmt: TexelFormat) -> None:
    slot = _slots("coffee.png", 1)[0]
    data = encode_slot(slot, fmt, bc7_quality="fast")
    assert (
        len(data) == raw_size(fmt, S) == PackHeader(width=300, height=300, texel_format=fmt, srgb=False).tile_raw_size
    )


@pytest.mark.parametrize("name", PHOTOS)
def test_bc1_and_bc7_quality_on_photographs(name: str) -> None:
    slots = _slots(name)
    got1 = np.stack([decode(encode_slot(s, TexelFormat.BC1), TexelFormat.BC1, S) for s in slots])
    got7 = np.stack([decode(encode_slot(s, TexelFormat.BC7, bc7_quality="fast"), TexelFormat.BC7, S) for s in slots])
    src = np.stack(slots)
    assert ref.psnr(got1[..., :3], src[..., :3]) >= 30
    assert ref.psnr(got7, src) >= 40


def test_bc3_keeps_alpha_bc4_red_bc5_red_green() -> None:
    slot = _slots("astronaut.png", 1)[0].copy()
    slot[..., 3] = np.arange(S, dtype=np.uint8)[None, :] * 2
    bc3 = decode(encode_slot(slot, TexelFormat.BC3), TexelFormat.BC3, S)
    assert ref.psnr(bc3[..., 3], slot[..., 3]) >= 40
    bc4 = decode(encode_slot(slot, TexelFormat.BC4), TexelFormat.BC4, S)
    assert ref.psnr(bc4[..., 0], slot[..., 0]) >= 38
    bc5 = decode(encode_slot(slot, TexelFormat.BC5), TexelFormat.BC5, S)
    assert ref.psnr(bc5[..., 0], slot[..., 0]) >= 38 and ref.psnr(bc5[..., 1], slot[..., 1]) >= 38


def test_bc7_presets_order_by_quality() -> None:
    slot = _slots("chelsea.png", 1)[0]
    q = {p: ref.psnr(decode(encode_slot(slot, TexelFormat.BC7, bc7_quality=p), TexelFormat.BC7, S), slot)
         for p in ("fast", "normal", "slow")}  # fmt: skip
    assert q["slow"] >= q["fast"] - 0.05
    with pytest.raises(ValueError, match="ultra"):
        encode_slot(slot, TexelFormat.BC7, bc7_quality="ultra")


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
def test_bad_slots_are_rejected_before_etcpak_sees_them(slot: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_slot(slot, TexelFormat.BC1)  # type: ignore[arg-type]
