"""Decode a level of a pack (or a region of it) back to an image, for inspection and tests.

Decoding uses texture2ddecoder, a decoder independent of the encoder (etcpak) that made the pack.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import EngineError, PackFormatError
from .format import PackHeader, TexelFormat
from .reader import PackReader
from .writer import create_temp, output_mode

MAX_EXTRACT_PIXELS = 1 << 28  # 256 MPixel (1 GiB as RGBA8): larger levels need --region


def decode_slot(raw: bytes, header: PackHeader) -> np.ndarray:
    """A tile's raw bytes -> (S, S, 4) uint8 RGBA (BC4: grey in RGB; BC5: R, G, 0; BC6H: linear
    values clipped to [0, 1], times 255)."""
    import texture2ddecoder as t2d

    s = header.slot_size
    fmt = header.texel_format
    if fmt is TexelFormat.RGBA8:
        return np.frombuffer(raw, np.uint8).reshape(s, s, 4).copy()
    decoder = {
        TexelFormat.BC1: t2d.decode_bc1,
        TexelFormat.BC3: t2d.decode_bc3,
        TexelFormat.BC4: t2d.decode_bc4,
        TexelFormat.BC5: t2d.decode_bc5,
        TexelFormat.BC7: t2d.decode_bc7,
        TexelFormat.BC6H: t2d.decode_bc6,
    }[fmt]
    bgra = np.frombuffer(decoder(raw, s, s), np.uint8).reshape(s, s, 4)
    rgba = bgra[..., [2, 1, 0, 3]].copy()
    if fmt is TexelFormat.BC4:
        rgba[..., 1] = rgba[..., 2] = rgba[..., 0]
        rgba[..., 3] = 255
    elif fmt is TexelFormat.BC5:
        rgba[..., 2] = 0
        rgba[..., 3] = 255
    return rgba


def parse_region(text: str) -> tuple[int, int, int, int]:
    """'x,y,w,h' -> tuple; ValueError naming the text when malformed."""
    try:
        x, y, w, h = (int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"region must be x,y,w,h integers, got {text!r}") from None
    if x < 0 or y < 0 or w < 1 or h < 1:
        raise ValueError(f"region {text!r} needs x, y >= 0 and w, h >= 1")
    return x, y, w, h


def extract_level(
    pack: str | os.PathLike[str] | PackReader, level: int, region: tuple[int, int, int, int] | None = None
) -> np.ndarray:
    """Decode `region` (default: all) of `level` into an (h, w, 4) uint8 RGBA array."""
    reader = pack if isinstance(pack, PackReader) else PackReader(pack)
    try:
        h = reader.header
        if not 0 <= level < h.level_count:
            raise EngineError(f"level {level} is outside 0..{h.level_count - 1}")
        lw, lh = h.level_dims(level)
        x0, y0, w, hh = region if region else (0, 0, lw, lh)
        if x0 + w > lw or y0 + hh > lh:
            raise EngineError(f"region {x0},{y0},{w},{hh} runs outside level {level} ({lw} x {lh})")
        if w * hh > MAX_EXTRACT_PIXELS:
            raise EngineError(f"{w} x {hh} is too large to extract at once; pass --region")
        t, b = h.tile_size, h.border
        out = np.empty((hh, w, 4), np.uint8)
        for ty in range(y0 // t, (y0 + hh - 1) // t + 1):
            for tx in range(x0 // t, (x0 + w - 1) // t + 1):
                content = decode_slot(reader.read_tile(level, tx, ty), h)[b : b + t, b : b + t]
                # Intersection of this tile's content with the region, in level texels.
                ax, ay = max(x0, tx * t), max(y0, ty * t)
                bx, by = min(x0 + w, (tx + 1) * t), min(y0 + hh, (ty + 1) * t)
                src = content[ay - ty * t : by - ty * t, ax - tx * t : bx - tx * t]
                out[ay - y0 : by - y0, ax - x0 : bx - x0] = src
        return out
    finally:
        if reader is not pack:
            reader.close()


def image_mode_for(fmt: TexelFormat) -> str:
    return {TexelFormat.BC4: "L", TexelFormat.BC1: "RGB", TexelFormat.BC5: "RGB", TexelFormat.BC6H: "RGB"}.get(
        fmt, "RGBA"
    )


def write_image(rgba: np.ndarray, path: Path, mode: str = "RGBA") -> None:
    """Write atomically (temporary file, then rename) so a failed write leaves nothing behind."""
    from PIL import Image

    if not path.parent.is_dir() and str(path.parent):
        raise EngineError(f"output folder {path.parent} does not exist")
    img = Image.fromarray(np.ascontiguousarray(rgba), "RGBA")
    if mode == "L":
        img = img.getchannel("R")
    elif mode == "RGB":
        img = img.convert("RGB")
    fmt = _pil_format(path)
    fd, tmp = create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                img.save(f, format=fmt)
            except (KeyError, ValueError) as exc:
                raise EngineError(f"cannot write {path}: {exc}") from None
            os.fchmod(f.fileno(), output_mode())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _pil_format(path: Path) -> str:
    from PIL import Image

    Image.init()
    fmt = Image.EXTENSION.get(path.suffix.lower())
    if fmt is None:
        raise EngineError(f"cannot tell the image format of {path} from its extension (use .png)")
    return fmt


__all__ = ["PackFormatError", "decode_slot", "extract_level", "parse_region", "write_image"]
