"""Radiance HDR (``.hdr``, ``.pic``) images: RGBE texels, flat or run-length encoded, as float32 RGB.

Neither Pillow nor libvips (as installed) reads them, so this module does, with numpy, from bytes
that are never trusted:

- **Header.** ``#?RADIANCE`` or ``#?RGBE`` (any ``#?`` program name), then ``NAME=value`` lines and
  comments up to an empty line, at most `MAX_HEADER_BYTES`. ``FORMAT`` must be ``32-bit_rle_rgbe``
  when given (XYZE is refused). ``EXPOSURE`` is recorded, not applied (as most readers do: the
  stored values are what the picture's maker saw).
- **Resolution line.** ``-Y H +X W`` (rows top to bottom, the usual), or ``+Y`` / ``-X`` for
  pictures stored bottom-up or mirrored, which are flipped into the usual order. Pictures stored
  column by column (``+X W -Y H`` and the like) are refused.
- **Scanlines.** Each is either the "new" run-length encoding (widths 8..32767: the bytes
  ``2 2 W>>8 W&255``, then each of R, G, B, E as runs: a count above 128 repeats the next byte
  count - 128 times, a count of 1..128 copies that many bytes) or flat RGBE quadruples. Flat
  scanlines holding the old encoding's run markers (``1 1 1 n``) are refused rather than misread.

Sizes are checked before anything is allocated: the texel count against `MAX_TEXELS`, and the
least number of bytes the claimed scanlines can take (flat or encoded) against what the file holds,
so a short or hostile file fails in one line (`SourceError`) before a large buffer exists. Decoding
is linear in the file's size: one pass over the runs, each run one slice copy.

Texel values follow Radiance's own ``colr_color``: ``(m + 0.5) * 2^(e - 136)`` for mantissa ``m``
and exponent ``e > 0``; ``e == 0`` is black.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SourceError

__all__ = ["MAX_HEADER_BYTES", "MAX_TEXELS", "HdrImage", "is_hdr_bytes", "parse_hdr", "read_hdr"]

MAX_HEADER_BYTES = 1 << 16  # header lines, resolution line included
MAX_TEXELS = 1 << 26  # 8192 x 8192: the decoded image alone is 768 MiB of float32 RGB
MAX_SIDE = 1 << 20
SIGNATURE = b"#?"
_RESOLUTION = re.compile(rb"([-+])([XY]) +(\d{1,8}) +([-+])([XY]) +(\d{1,8})")
_PROGRAM = re.compile(rb"#\?[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class HdrImage:
    """A decoded Radiance picture: ``rgb`` is (height, width, 3) float32, top row first."""

    rgb: np.ndarray
    exposure: float  # the product of the header's EXPOSURE values (1.0 when none)

    @property
    def width(self) -> int:
        return int(self.rgb.shape[1])

    @property
    def height(self) -> int:
        return int(self.rgb.shape[0])


def is_hdr_bytes(head: bytes) -> bool:
    """Whether `head` (a file's first bytes) starts like a Radiance picture."""
    return bool(_PROGRAM.match(head[:80]))


def read_hdr(path: str | os.PathLike[str], *, max_texels: int = MAX_TEXELS) -> HdrImage:
    """Read and decode the Radiance picture at `path` (see the module docstring).

    Raises
    ------
    SourceError
        one line naming the file: unreadable, not a Radiance picture, truncated, or too large
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise SourceError(f"{p}: no such file") from None
    except OSError as exc:
        raise SourceError(f"{p}: cannot read: {exc.strerror or exc}") from None
    return parse_hdr(data, str(p), max_texels=max_texels)


def parse_hdr(data: bytes, name: str = "<bytes>", *, max_texels: int = MAX_TEXELS) -> HdrImage:
    """Decode a Radiance picture held in `data`; `name` is what errors call it.

    Raises
    ------
    SourceError
        one line naming `name`, for anything that is not a complete, readable picture
    """
    try:
        return _parse(memoryview(data).cast("B"), max_texels)
    except _Refused as exc:
        raise SourceError(f"{name}: {exc}") from None


class _Refused(Exception):
    """Why the bytes are not a readable picture (one line, without the file's name)."""


def _header(data: memoryview) -> tuple[int, int, int, bool, bool, float]:
    """(body offset, width, height, flip rows, flip columns, exposure) from the header."""
    limit = min(len(data), MAX_HEADER_BYTES)
    head = bytes(data[:limit])
    if not _PROGRAM.match(head):
        raise _Refused("not a Radiance HDR picture (no #?RADIANCE signature)")
    end = head.find(b"\n\n")
    if end < 0:
        if len(data) > MAX_HEADER_BYTES:
            raise _Refused(f"header is longer than {MAX_HEADER_BYTES} bytes")
        raise _Refused("truncated in the header (no empty line before the resolution)")
    exposure = 1.0
    for line in head[:end].split(b"\n")[1:]:
        if line.startswith(b"FORMAT="):
            fmt = line[7:].strip()
            if fmt != b"32-bit_rle_rgbe":
                shown = fmt[:40].decode("ascii", "replace")
                raise _Refused(f"pixel format {shown!r} is not supported (only 32-bit_rle_rgbe)")
        elif line.startswith(b"EXPOSURE="):
            try:
                value = float(line[9:].strip()[:32])
            except ValueError:
                raise _Refused("EXPOSURE is not a number") from None
            if not (np.isfinite(value) and value > 0):
                raise _Refused("EXPOSURE is not a positive number")
            exposure *= value
    start = end + 2
    eol = head.find(b"\n", start)
    if eol < 0:
        if len(data) > MAX_HEADER_BYTES:
            raise _Refused(f"header is longer than {MAX_HEADER_BYTES} bytes")
        raise _Refused("truncated in the resolution line")
    m = _RESOLUTION.fullmatch(head[start:eol].strip())
    if m is None:
        raise _Refused("resolution line is not of the form -Y height +X width")
    sign1, axis1, n1, sign2, axis2, n2 = m.groups()
    if axis1 != b"Y" or axis2 != b"X":
        raise _Refused("pictures stored column by column (a resolution line starting with X) are not supported")
    height, width = int(n1), int(n2)
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise _Refused(f"size {width} x {height} is outside 1..{MAX_SIDE} a side")
    return eol + 1, width, height, sign1 == b"+", sign2 == b"-", exposure


def _parse(data: memoryview, max_texels: int) -> HdrImage:
    body, width, height, flip_rows, flip_cols, exposure = _header(data)
    texels = width * height
    if texels > max_texels:
        raise _Refused(f"{width:,} x {height:,} texels is over the {max_texels:,}-texel limit")
    left = len(data) - body
    encodable = 8 <= width <= 0x7FFF
    # The least bytes one scanline can take: flat RGBE, or the run-length header plus, per channel,
    # one 2-byte run for every 127 texels (a run repeats at most 127 times).
    least_line = 4 + 8 * -(-width // 127) if encodable else 4 * width
    if height * min(least_line, 4 * width) > left:
        raise _Refused(f"claims {width:,} x {height:,} texels but holds only {left:,} bytes of pixels (truncated?)")
    rgbe = np.empty((height, width, 4), np.uint8)
    pos = body
    for y in range(height):
        pos = _scanline(data, pos, width, encodable, rgbe[y], y)
    if flip_rows:
        rgbe = rgbe[::-1]
    if flip_cols:
        rgbe = rgbe[:, ::-1]
    return HdrImage(rgb=rgbe_to_float(rgbe), exposure=exposure)


def _scanline(data: memoryview, pos: int, width: int, encodable: bool, out: np.ndarray, y: int) -> int:
    """Decode scanline `y` starting at `pos` into `out` ((width, 4) uint8); returns the next offset."""
    end = len(data)
    if pos + 4 > end:
        raise _Refused(f"truncated at scanline {y}")
    b0, b1, b2, b3 = data[pos], data[pos + 1], data[pos + 2], data[pos + 3]
    if not (encodable and b0 == 2 and b1 == 2 and not b2 & 0x80):
        need = 4 * width
        if pos + need > end:
            raise _Refused(f"truncated at scanline {y}")
        flat = np.frombuffer(data, np.uint8, need, pos).reshape(width, 4)
        if ((flat[:, 0] == 1) & (flat[:, 1] == 1) & (flat[:, 2] == 1)).any():
            raise _Refused(f"scanline {y} uses the old run-length encoding, which is not supported")
        out[:] = flat
        return pos + need
    if (b2 << 8) | b3 != width:
        raise _Refused(f"scanline {y} says it is {(b2 << 8) | b3} texels wide, the picture {width}")
    pos += 4
    channel = bytearray(width)
    for c in range(4):
        filled = 0
        while filled < width:
            if pos >= end:
                raise _Refused(f"truncated at scanline {y}")
            count = data[pos]
            if count > 128:
                count -= 128
                if pos + 1 >= end:
                    raise _Refused(f"truncated at scanline {y}")
                if filled + count > width:
                    raise _Refused(f"scanline {y} has a run past its end")
                channel[filled : filled + count] = bytes((data[pos + 1],)) * count
                pos += 2
            else:
                if count == 0 or filled + count > width:
                    raise _Refused(f"scanline {y} has a bad run (count {count})")
                if pos + 1 + count > end:
                    raise _Refused(f"truncated at scanline {y}")
                channel[filled : filled + count] = data[pos + 1 : pos + 1 + count]
                pos += 1 + count
            filled += count
        out[:, c] = np.frombuffer(channel, np.uint8)
    return pos


def rgbe_to_float(rgbe: np.ndarray) -> np.ndarray:
    """(..., 4) uint8 RGBE -> (..., 3) float32 RGB (Radiance's ``colr_color``)."""
    e = rgbe[..., 3].astype(np.int32)
    scale = np.where(e > 0, np.ldexp(np.float32(1.0), e - 136), 0.0).astype(np.float32)
    out = rgbe[..., :3].astype(np.float32)
    out += np.float32(0.5)
    out *= scale[..., None]
    return out
