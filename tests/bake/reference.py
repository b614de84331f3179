"""Independent float64 reference for the baker's output, written without the engine's code paths.

The engine filters with lookup tables and a pair-table gather in float32; this module uses the
sRGB formulas in float64 and explicit index arrays, so agreement means both are right.
"""

from __future__ import annotations

import functools

import numpy as np

from texstream.testing import psnr as testing_psnr


def srgb_decode(u8: np.ndarray) -> np.ndarray:
    c = u8.astype(np.float64) / 255.0
    return np.where(c <= 0.04045, c / 12.92, np.power((c + 0.055) / 1.055, 2.4))


def srgb_encode(lin: np.ndarray) -> np.ndarray:
    x = np.clip(lin, 0.0, 1.0)
    s = np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(x, 1.0 / 2.4) - 0.055)
    return np.clip(np.floor(s * 255.0 + 0.5), 0, 255).astype(np.uint8)


def to_linear(rgba: np.ndarray, srgb: bool) -> np.ndarray:
    out = rgba.astype(np.float64) / 255.0
    if srgb:
        out[..., :3] = srgb_decode(rgba[..., :3])
    return out


def to_u8(lin: np.ndarray, srgb: bool) -> np.ndarray:
    out = np.clip(np.floor(np.clip(lin, 0, 1) * 255.0 + 0.5), 0, 255).astype(np.uint8)
    if srgb:
        out[..., :3] = srgb_encode(lin[..., :3])
    return out


def address(idx: np.ndarray, size: int, wrap: bool) -> np.ndarray:
    return np.mod(idx, size) if wrap else np.clip(idx, 0, size - 1)


def next_level(lin: np.ndarray, wrap: bool) -> np.ndarray:
    """Mean of texels (2i, 2i+1) x (2j, 2j+1), the missing ones at odd edges by address mode."""
    h, w = lin.shape[:2]
    nh, nw = max(1, -(-h // 2)), max(1, -(-w // 2))
    acc = np.zeros((nh, nw, lin.shape[2]))
    for dy in (0, 1):
        rows = address(2 * np.arange(nh) + dy, h, wrap)
        for dx in (0, 1):
            cols = address(2 * np.arange(nw) + dx, w, wrap)
            acc += lin[np.ix_(rows, cols)]
    return acc / 4.0


def pyramid(rgba: np.ndarray, count: int, srgb: bool, wrap: bool, premultiplied: bool = False) -> list[np.ndarray]:
    """uint8 RGBA of every level, level 0 being `rgba` itself; `premultiplied`: colour filtered as
    sum(c * a) / sum(a) (0 where sum(a) == 0), as the baker filters sRGB colour with alpha."""
    levels = [rgba]
    lin = to_linear(rgba, srgb)
    for _ in range(count - 1):
        if premultiplied:
            pre = lin.copy()
            pre[..., :3] *= pre[..., 3:]
            lin = next_level(pre, wrap)
            a = lin[..., 3:]
            lin[..., :3] = np.divide(lin[..., :3], a, out=np.zeros_like(lin[..., :3]), where=a > 0)
        else:
            lin = next_level(lin, wrap)
        levels.append(to_u8(lin, srgb))
    return levels


def expected_slot(level: np.ndarray, x: int, y: int, tile: int, border: int, wrap: bool) -> np.ndarray:
    h, w = level.shape[:2]
    s = tile + 2 * border
    rows = address(np.arange(y * tile - border, y * tile - border + s), h, wrap)
    cols = address(np.arange(x * tile - border, x * tile - border + s), w, wrap)
    return level[np.ix_(rows, cols)]


# every channel: the bake tests check alpha as well as colour
psnr = functools.partial(testing_psnr, ignore_alpha=False)
