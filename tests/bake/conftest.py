"""Helpers for the baker tests: decode a pack with an independent decoder, force small bands."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import texture2ddecoder as t2d
from PIL import Image

from texstream.bake import jobs
from texstream.pack import PackHeader, PackReader, TexelFormat

ASSETS = Path(__file__).resolve().parents[2] / "assets"
PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png")

_DECODERS = {
    TexelFormat.BC1: t2d.decode_bc1,
    TexelFormat.BC3: t2d.decode_bc3,
    TexelFormat.BC4: t2d.decode_bc4,
    TexelFormat.BC5: t2d.decode_bc5,
    TexelFormat.BC7: t2d.decode_bc7,
    TexelFormat.BC6H: t2d.decode_bc6,  # 8-bit, clipped to [0, 1]: right for slots of 8-bit texels
}


def decode(raw: bytes, fmt: TexelFormat, size: int) -> np.ndarray:
    """Raw slot bytes -> (S, S, 4) RGBA. texture2ddecoder returns BGRA: swap it back."""
    if fmt is TexelFormat.RGBA8:
        return np.frombuffer(raw, np.uint8).reshape(size, size, 4).copy()
    bgra = np.frombuffer(_DECODERS[fmt](raw, size, size), np.uint8).reshape(size, size, 4)
    return bgra[..., [2, 1, 0, 3]].copy()


def read_slots(path: Path) -> tuple[PackHeader, dict[tuple[int, int, int], np.ndarray]]:
    """Every tile of a pack, decoded: {(level, x, y): (S, S, 4) RGBA}."""
    slots = {}
    with PackReader(path) as r:
        h = r.header
        for lv in range(h.level_count):
            tx, ty = h.tiles_in_level(lv)
            for y in range(ty):
                for x in range(tx):
                    slots[(lv, x, y)] = decode(r.read_tile(lv, x, y), h.texel_format, h.slot_size)
    return h, slots


def assemble(header: PackHeader, slots: dict, level: int) -> np.ndarray:
    """A level's texels put back together from its tiles' content (borders dropped)."""
    w, h = header.level_dims(level)
    t, b = header.tile_size, header.border
    tx, ty = header.tiles_in_level(level)
    full = np.zeros((ty * t, tx * t, 4), np.uint8)
    for y in range(ty):
        for x in range(tx):
            full[y * t : (y + 1) * t, x * t : (x + 1) * t] = slots[(level, x, y)][b : b + t, b : b + t]
    return full[:h, :w]


def load_photo(name: str) -> np.ndarray:
    return np.asarray(Image.open(ASSETS / name).convert("RGBA")).copy()


@pytest.fixture
def small_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny band and final-stage budgets, so small images take the multi-band, multi-stage paths."""
    monkeypatch.setattr(jobs, "BAND_BYTES", 1 << 14)
    monkeypatch.setattr(jobs, "FINAL_BYTES", 1 << 12)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())
