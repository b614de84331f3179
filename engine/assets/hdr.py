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
is linear in the file's size: one pass over the runs. The scanlines are decoded by the compiled
helper (``ts_hdr_scanlines`` in engine/native/_native.c, every read and write bounds-checked) when it
is built, else by the Python twin here, with the same results and the same errors
(`use_scanline_decoder` picks one, for tests and benchmarks).

Texel values follow Radiance's own ``colr_color``: ``(m + 0.5) * 2^(e - 136)`` for mantissa ``m``
and exponent ``e > 0``; ``e == 0`` is black.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import SourceError

if TYPE_CHECKING:
    from ..native import HdrFunctions

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_TEXELS",
    "HdrImage",
    "is_hdr_bytes",
    "parse_hdr",
    "read_hdr",
    "use_scanline_decoder",
]

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
    _decode_scanlines(data, body, width, height, encodable, rgbe)
    if flip_rows:
        rgbe = rgbe[::-1]
    if flip_cols:
        rgbe = rgbe[:, ::-1]
    return HdrImage(rgb=rgbe_to_float(rgbe), exposure=exposure)


class HdrStatus(enum.IntEnum):
    """Why scanline decoding stopped (the TS_HDR_* codes of _native.c)."""

    OK = 0
    TRUNCATED = 1
    OLD_RLE = 2
    WIDTH = 3
    RUN_PAST = 4
    BAD_RUN = 5


def _refusal(status: HdrStatus, row: int, value: int, width: int) -> _Refused:
    """The one line for a scanline decoder's failure, the same for both decoders."""
    if status is HdrStatus.OLD_RLE:
        return _Refused(f"scanline {row} uses the old run-length encoding, which is not supported")
    if status is HdrStatus.WIDTH:
        return _Refused(f"scanline {row} says it is {value} texels wide, the picture {width}")
    if status is HdrStatus.RUN_PAST:
        return _Refused(f"scanline {row} has a run past its end")
    if status is HdrStatus.BAD_RUN:
        return _Refused(f"scanline {row} has a bad run (count {value})")
    return _Refused(f"truncated at scanline {row}")


class _ScanlineFailure(Exception):
    def __init__(self, status: HdrStatus, row: int, value: int = 0) -> None:
        super().__init__(status, row, value)
        self.status, self.row, self.value = status, row, value


# Which decoder runs: "auto" (the compiled helper when built, else Python), "native" or "python";
# `_library` is the path of another build of the helper (the sanitizer's), None for the installed one.
_decoder_kind = "auto"
_library: str | None = None


def use_scanline_decoder(kind: str, library: str | None = None) -> tuple[str, str | None]:
    """Pick the decoder of scanlines and RGBE values: "auto" (default: the compiled helper when it is
    built), "native" (the compiled helper, or the build at `library`; an error when it is missing) or
    "python" (Python and numpy). Returns the previous ``(kind, library)``, to restore it."""
    global _decoder_kind, _library
    if kind not in ("auto", "native", "python"):
        raise ValueError(f"scanline decoder must be auto, native or python, got {kind!r}")
    previous = (_decoder_kind, _library)
    _decoder_kind, _library = kind, library
    return previous


def _compiled() -> HdrFunctions | None:
    if _decoder_kind == "python":
        return None
    from ..native import hdr_functions

    functions = hdr_functions(_library)
    if functions is None and _decoder_kind == "native":
        raise RuntimeError(f"no compiled Radiance decoder: {_library or 'the helper'} is not built or predates it")
    return functions


def _decode_scanlines(data: memoryview, pos: int, width: int, height: int, encodable: bool, out: np.ndarray) -> int:
    """Every scanline from `pos` into `out` ((height, width, 4) uint8); the offset after the last one."""
    compiled = _compiled()
    if compiled is not None:
        src = np.frombuffer(data, np.uint8)  # no copy; kept alive for the call
        result = (ctypes.c_int64 * 3)()
        end = compiled.scanlines(src.ctypes.data, src.size, pos, width, height, int(encodable), out.ctypes.data, result)
        if end < 0:
            raise _refusal(HdrStatus(result[0]), int(result[1]), int(result[2]), width)
        return int(end)
    try:
        for y in range(height):
            pos = _scanline(data, pos, width, encodable, out[y], y)
    except _ScanlineFailure as failure:
        raise _refusal(failure.status, failure.row, failure.value, width) from None
    return pos


def _scanline(data: memoryview, pos: int, width: int, encodable: bool, out: np.ndarray, y: int) -> int:
    """The Python twin of ts_hdr_scanlines for scanline `y` at `pos`, into `out` ((width, 4) uint8);
    returns the next offset, or raises _ScanlineFailure with the code the compiled one gives."""
    end = len(data)
    if pos + 4 > end:
        raise _ScanlineFailure(HdrStatus.TRUNCATED, y)
    b0, b1, b2, b3 = data[pos], data[pos + 1], data[pos + 2], data[pos + 3]
    if not (encodable and b0 == 2 and b1 == 2 and not b2 & 0x80):
        need = 4 * width
        if pos + need > end:
            raise _ScanlineFailure(HdrStatus.TRUNCATED, y)
        flat = np.frombuffer(data, np.uint8, need, pos).reshape(width, 4)
        if ((flat[:, 0] == 1) & (flat[:, 1] == 1) & (flat[:, 2] == 1)).any():
            raise _ScanlineFailure(HdrStatus.OLD_RLE, y)
        out[:] = flat
        return pos + need
    if (b2 << 8) | b3 != width:
        raise _ScanlineFailure(HdrStatus.WIDTH, y, (b2 << 8) | b3)
    pos += 4
    channel = bytearray(width)
    for c in range(4):
        filled = 0
        while filled < width:
            if pos >= end:
                raise _ScanlineFailure(HdrStatus.TRUNCATED, y)
            count = data[pos]
            if count > 128:
                count -= 128
                if pos + 1 >= end:
                    raise _ScanlineFailure(HdrStatus.TRUNCATED, y)
                if filled + count > width:
                    raise _ScanlineFailure(HdrStatus.RUN_PAST, y)
                channel[filled : filled + count] = bytes((data[pos + 1],)) * count
                pos += 2
            else:
                if count == 0 or filled + count > width:
                    raise _ScanlineFailure(HdrStatus.BAD_RUN, y, count)
                if pos + 1 + count > end:
                    raise _ScanlineFailure(HdrStatus.TRUNCATED, y)
                channel[filled : filled + count] = data[pos + 1 : pos + 1 + count]
                pos += 1 + count
            filled += count
        out[:, c] = np.frombuffer(channel, np.uint8)
    return pos


@functools.cache
def _rgbe_table() -> np.ndarray:
    """float32[65536]: ``(e << 8) | m`` -> ``(m + 0.5) * 2^(e - 136)``, 0 for ``e == 0`` (Radiance's
    ``colr_color``), each entry one float32 multiply of exact operands."""
    e = np.arange(256, dtype=np.int32)
    scale = np.where(e > 0, np.ldexp(np.float32(1.0), e - 136), 0.0).astype(np.float32)
    mantissa = np.arange(256, dtype=np.float32) + np.float32(0.5)
    return np.ascontiguousarray((scale[:, None] * mantissa[None, :]).astype(np.float32).ravel())


def rgbe_to_float(rgbe: np.ndarray) -> np.ndarray:
    """(..., 4) uint8 RGBE -> (..., 3) float32 RGB (Radiance's ``colr_color``), through one table:
    the compiled helper's loop when it is built and chosen, else numpy (the same lookups)."""
    table = _rgbe_table()
    out = np.empty(rgbe.shape[:-1] + (3,), np.float32)
    compiled = _compiled()
    if compiled is not None and rgbe.size:
        src = np.ascontiguousarray(rgbe, np.uint8)
        compiled.rgbe_to_float(src.ctypes.data, src.size // 4, table.ctypes.data, out.ctypes.data)
        return out
    exponent = rgbe[..., 3].astype(np.uint16) << 8
    index = np.empty(rgbe.shape[:-1], np.uint16)
    for c in range(3):
        np.bitwise_or(exponent, rgbe[..., c], out=index)
        np.take(table, index, out=out[..., c])
    return out
