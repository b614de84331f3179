"""High dynamic range test files written here: Radiance HDR by an encoder written from the format's
description (not the reader's code), OpenEXR by the openexr package."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def float_to_rgbe(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) float -> (H, W, 4) uint8 RGBE, as Radiance's ``setcolr``: the largest channel's
    frexp gives the shared exponent, each channel ``int(c * m * 256 / max)``."""
    rgb = np.maximum(np.asarray(rgb, np.float64), 0.0)
    top = rgb.max(axis=-1)
    mant, exp = np.frexp(top)
    out = np.zeros(rgb.shape[:-1] + (4,), np.uint8)
    lit = top > 1e-32
    scale = np.zeros_like(top)
    scale[lit] = mant[lit] * 255.9999 / top[lit]
    for c in range(3):
        out[..., c] = np.where(lit, np.floor(rgb[..., c] * scale), 0).astype(np.uint8)
    out[..., 3] = np.where(lit, exp + 128, 0).astype(np.uint8)
    return out


def _rle_channel(values: bytes) -> bytes:
    """One channel of one scanline in the new run-length encoding: runs of 4+ equal bytes as
    (128 + n, v), everything else as literal chunks (n, bytes) of at most 128."""
    out = bytearray()
    i, n = 0, len(values)
    literal = bytearray()

    def flush() -> None:
        for k in range(0, len(literal), 128):
            chunk = literal[k : k + 128]
            out.append(len(chunk))
            out.extend(chunk)
        literal.clear()

    while i < n:
        j = i
        while j < n and j - i < 127 and values[j] == values[i]:
            j += 1
        if j - i >= 4:
            flush()
            out.extend((128 + j - i, values[i]))
            i = j
        else:
            literal.append(values[i])
            i += 1
    flush()
    return bytes(out)


def hdr_bytes(rgb: np.ndarray, *, rle: bool = True, resolution: str | None = None, header: str = "") -> bytes:
    """A Radiance picture of `rgb` ((H, W, 3) float, top row first): run-length encoded scanlines
    (when the width allows) or flat ones; `resolution` overrides the resolution line (the pixels
    are then written in the order given)."""
    h, w = rgb.shape[:2]
    rgbe = float_to_rgbe(rgb)
    lines = [b"#?RADIANCE", b"# written by the texstream tests", b"FORMAT=32-bit_rle_rgbe"]
    if header:
        lines.append(header.encode())
    out = bytearray(b"\n".join(lines) + b"\n\n")
    out += (resolution or f"-Y {h} +X {w}").encode() + b"\n"
    for y in range(h):
        row = rgbe[y]
        if rle and 8 <= w <= 0x7FFF:
            out += bytes((2, 2, w >> 8, w & 255))
            for c in range(4):
                out += _rle_channel(row[:, c].tobytes())
        else:
            out += row.tobytes()
    return bytes(out)


def write_hdr(path: Path, rgb: np.ndarray, **kw: object) -> Path:
    path.write_bytes(hdr_bytes(rgb, **kw))  # type: ignore[arg-type]
    return path


def write_exr(path: Path, rgb: np.ndarray, *, half: bool = True) -> Path:
    """An OpenEXR scanline file of `rgb` ((H, W, 3) RGB, or (H, W, 4) RGBA; half floats by default,
    ZIP compressed)."""
    import OpenEXR

    pixels = np.ascontiguousarray(rgb.astype(np.float16 if half else np.float32))
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    with OpenEXR.File(header, {"RGBA" if pixels.shape[2] == 4 else "RGB": pixels}) as f:
        f.write(str(path))
    return path


def sky(width: int, height: int, seed: int = 3) -> np.ndarray:
    """A smooth HDR picture: a blue-to-orange gradient, soft clouds, and a sun peaking near 12."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / width, y / height
    base = np.stack([0.2 + 0.8 * v, 0.35 + 0.3 * v, 0.9 - 0.6 * v], -1)
    phase = rng.uniform(0, 2 * np.pi, 3)
    clouds = 0.15 * (np.sin(9 * u + phase[0]) * np.sin(7 * v + phase[1]) + np.sin(17 * (u + v) + phase[2]))
    sun = 12.0 * np.exp(-(((u - 0.7) ** 2 + (v - 0.3) ** 2) / 0.004))
    return (base * (1.0 + clouds[..., None]) + sun[..., None] * np.array([1.0, 0.9, 0.7])).astype(np.float32)
