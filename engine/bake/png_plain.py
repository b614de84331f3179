"""Plain PNG files decoded by libspng (through imagecodecs, when installed) into numpy arrays, for
`source.PillowSource`: only files whose samples are their pixels as they are (8-bit grey, RGB or RGBA,
not interlaced, one image, nothing for a reader to apply); every other PNG goes to Pillow."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

__all__ = ["decode_plain_png", "plain_png_layout"]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PLAIN_PNG_CHANNELS = {0: 1, 2: 3, 6: 4}  # colour type (grey, RGB, RGBA) -> channels, at 8 bits a sample
# Chunks whose meaning Pillow applies to the pixels: a transparency key, frames of an animation, an
# EXIF or XMP orientation (in eXIf, or in text chunks under these keywords).
_APPLIED_CHUNKS = (b"tRNS", b"acTL", b"fcTL", b"eXIf")
_ORIENTATION_TEXT = (b"Raw profile type exif", b"XML:com.adobe.xmp")


def plain_png_layout(data: bytes | memoryview) -> tuple[int, int, int] | None:
    """(width, height, channels) of a whole PNG file whose pixels are its 8-bit grey, RGB or RGBA
    samples as they are: not interlaced, one image, no transparency key and no orientation (EXIF or
    XMP) for a reader to apply; None for any other file, or one that ends before its IEND chunk."""
    view = memoryview(data)
    if bytes(view[:8]) != _PNG_SIGNATURE or bytes(view[12:16]) != b"IHDR" or len(view) < 33:
        return None
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", view[16:29])
    if depth != 8 or colour not in _PLAIN_PNG_CHANNELS or interlace:
        return None
    at = 8
    while at + 8 <= len(view):
        length, kind = struct.unpack(">I4s", view[at : at + 8])
        if kind in _APPLIED_CHUNKS:
            return None
        if kind in (b"tEXt", b"zTXt", b"iTXt") and bytes(view[at + 8 : at + 8 + min(length, 80)]).split(b"\0")[0] in (
            _ORIENTATION_TEXT
        ):
            return None
        if kind == b"IEND":
            return width, height, _PLAIN_PNG_CHANNELS[colour]
        at += 12 + length
    return None


def _png_decoder():  # noqa: ANN202 (libspng through imagecodecs, or None where it is not installed)
    try:
        import imagecodecs

        return imagecodecs.spng_decode if imagecodecs.SPNG.available else None
    except (ImportError, AttributeError):
        return None


def decode_plain_png(img: object) -> np.ndarray | None:
    """A Pillow-opened PNG file decoded by libspng (imagecodecs, when installed) straight into a numpy
    array of its samples (height x width for grey, x 3 or x 4 for RGB and RGBA: Pillow's pixels);
    None where Pillow decodes it: other formats, PNG files `plain_png_layout` refuses, no
    imagecodecs, or a decode that fails (Pillow then reports the damage in its own words).

    Why: for a 2048² RGB photo Pillow takes about 125 ms of CPU time (its decode, then a copy
    through `tobytes` into numpy, into memory it faults in page by page), libspng into numpy's own
    (huge-page) arrays about 50 ms: a third of a small bake's command-line time."""
    filename = getattr(img, "filename", "")
    if getattr(img, "format", None) != "PNG" or not filename:
        return None
    decode = _png_decoder()
    if decode is None:
        return None
    try:
        data = Path(filename).read_bytes()
    except OSError:
        return None
    layout = plain_png_layout(data)
    if layout is None or layout[:2] != getattr(img, "size", None):
        return None
    width, height, channels = layout
    samples = np.empty((height, width) if channels == 1 else (height, width, channels), np.uint8)
    try:
        decode(data, out=samples)
    except Exception:  # noqa: BLE001 - damaged data: Pillow decodes it again and says what is wrong
        return None
    return samples
