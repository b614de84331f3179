"""What a DDS or KTX2 file holds once parsed: a block format and the 4x4 blocks of each mip level.

Both containers halve mip sizes by flooring (``max(1, w >> l)``); a level's data is its blocks row by
row, top row first, ``ceil(w / 4) x ceil(h / 4)`` of them, which is exactly a pack tile's layout.
The parsers check every size against the file's real length before they allocate anything, so a
hostile header can neither exhaust memory nor make the reader hang; every refusal is a
`SourceError` naming the file and the problem in one line.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import SourceError
from ..pack.format import MAX_DIMENSION, TexelFormat

# What to tell the user when a file holds something a pack cannot take without re-encoding.
REENCODE_ADVICE = (
    "decode it to PNG with another tool (texconv, ktx extract, basisu), then run `texstream bake` on the PNG"
)


@dataclass(frozen=True)
class BlockLevel:
    """One mip level: its true size in texels and its blocks, (ceil(h/4), ceil(w/4), block bytes) uint8."""

    width: int
    height: int
    blocks: np.ndarray


@dataclass(frozen=True, kw_only=True)
class BlockTexture:
    """A parsed DDS/KTX2 file.

    Attributes
    ----------
    path : Path
        the file read
    container : str
        "dds" or "ktx2"
    format_name : str
        the format as the file names it (DXGI, FourCC or VkFormat name)
    texel_format : TexelFormat
        the pack format the blocks are in
    srgb : bool | None
        what the file says about the colour transfer; None when it says nothing (legacy DDS FourCC)
    levels : tuple[BlockLevel, ...]
        level 0 first, floor-halved sizes
    """

    path: Path
    container: str
    format_name: str
    texel_format: TexelFormat
    srgb: bool | None
    levels: tuple[BlockLevel, ...]

    @property
    def width(self) -> int:
        return self.levels[0].width

    @property
    def height(self) -> int:
        return self.levels[0].height


def floor_dims(width: int, height: int, level: int) -> tuple[int, int]:
    """Size of mip `level` as DDS and KTX2 define it (floor halving, never below 1)."""
    return max(1, width >> level), max(1, height >> level)


def block_grid(width: int, height: int) -> tuple[int, int]:
    """(rows, columns) of 4x4 blocks covering a level."""
    return -(-height // 4), -(-width // 4)


def level_bytes(width: int, height: int, fmt: TexelFormat) -> int:
    rows, cols = block_grid(width, height)
    return rows * cols * fmt.block_bytes


def check_size(path: Path, width: int, height: int) -> None:
    """Refuse a level-0 size the pack format cannot hold (also keeps later arithmetic small)."""
    if not (1 <= width <= MAX_DIMENSION and 1 <= height <= MAX_DIMENSION):
        raise SourceError(f"{path}: size {width} x {height} is outside 1..{MAX_DIMENSION} texels a side")


def check_level_count(path: Path, count: int, width: int, height: int) -> None:
    """A chain longer than a full one (down to 1 x 1) is malformed."""
    full = max(width, height).bit_length()
    if not 1 <= count <= full:
        raise SourceError(f"{path}: {count} mip levels for {width} x {height} (a full chain has {full})")


def open_regular(path: Path) -> tuple[BinaryIO, int]:
    """Open a regular file for reading; (file, size). Folders, FIFOs and devices are refused before
    they are opened, so naming one never blocks."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SourceError(f"{path}: file not found") from None
    except OSError as exc:
        raise SourceError(f"{path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SourceError(f"{path}: not a regular file")
    try:
        f = open(path, "rb")  # noqa: SIM115 (returned to the caller, who closes it)
    except OSError as exc:
        raise SourceError(f"{path}: {exc.strerror or exc}") from None
    return f, os.fstat(f.fileno()).st_size


def read_exact(f: BinaryIO, path: Path, offset: int, size: int, what: str) -> bytes:
    """`size` bytes at `offset` (the caller has checked they lie inside the file)."""
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:  # the file shrank under us
        raise SourceError(f"{path}: {what} is truncated ({len(data)} of {size} bytes)")
    return data


def as_blocks(data: bytes, width: int, height: int, fmt: TexelFormat) -> np.ndarray:
    rows, cols = block_grid(width, height)
    return np.frombuffer(data, np.uint8).reshape(rows, cols, fmt.block_bytes)


# ---- decoding (texture2ddecoder: independent of the baker's encoder) --------------------------------
# What to tell the user when BC6H blocks must be decoded (padding past an edge, generated levels) and
# the float decoder is not installed.
BC6H_DECODER_ADVICE = "decoding BC6H blocks to float needs the imagecodecs package (pip install 'texstream[bc6h]')"


def _decoder(fmt: TexelFormat):  # noqa: ANN202 (imported lazily: only edge blocks and new mips need it)
    import texture2ddecoder as t2d

    return {
        TexelFormat.BC1: t2d.decode_bc1,
        TexelFormat.BC3: t2d.decode_bc3,
        TexelFormat.BC4: t2d.decode_bc4,
        TexelFormat.BC5: t2d.decode_bc5,
        TexelFormat.BC7: t2d.decode_bc7,
    }[TexelFormat(fmt)]


def _imagecodecs():  # noqa: ANN202 (the module, imported lazily; None when missing or built without BCn)
    try:
        import imagecodecs
    except ImportError:
        return None
    return imagecodecs if getattr(getattr(imagecodecs, "BCN", None), "available", False) else None


def require_float_decoder(path: Path, fmt: TexelFormat) -> None:
    """Refuse (one line naming `path`) a BC6H file when its half floats cannot be decoded."""
    if fmt is TexelFormat.BC6H and _imagecodecs() is None:
        raise SourceError(f"{path}: {BC6H_DECODER_ADVICE}")


def _decode_bc6h(blocks: np.ndarray) -> np.ndarray:
    """(rows, cols, 16) unsigned BC6H blocks -> (4 rows, 4 cols, 4) float32 RGBA, alpha 1.

    texture2ddecoder only gives BC6H as clamped 8-bit texels, so the half floats come from
    imagecodecs' BCn decoder (bcdec), which returns each texel's exact half-float value.
    """
    imagecodecs = _imagecodecs()
    if imagecodecs is None:
        raise SourceError(BC6H_DECODER_ADVICE)
    rows, cols, _ = blocks.shape
    half = imagecodecs.bcn_decode(np.ascontiguousarray(blocks).tobytes(), 6, shape=(4 * rows, 4 * cols, 3))
    out = np.empty((4 * rows, 4 * cols, 4), np.float32)
    out[..., :3] = half
    out[..., 3] = 1.0
    return out


def decode_grid(blocks: np.ndarray, fmt: TexelFormat) -> np.ndarray:
    """(rows, cols, block bytes) blocks -> (4 rows, 4 cols, 4) RGBA texels.

    uint8 for BC1-BC7; BC4 decodes to (r, 0, 0, 255) and BC5 to (r, g, 0, 255): the channels the
    baker's encoder reads. BC6H decodes to float32 linear RGB with alpha 1.0 (what the encoder takes).
    """
    rows, cols, nbytes = blocks.shape
    if nbytes != fmt.block_bytes:
        raise ValueError(f"{fmt.name.lower()} blocks are {fmt.block_bytes} bytes, got {nbytes}")
    dtype = np.float32 if fmt.float_texels else np.uint8
    if rows == 0 or cols == 0:
        return np.zeros((4 * rows, 4 * cols, 4), dtype)
    if fmt is TexelFormat.BC6H:
        return _decode_bc6h(blocks)
    bgra = _decoder(fmt)(np.ascontiguousarray(blocks).tobytes(), 4 * cols, 4 * rows)
    out = np.frombuffer(bgra, np.uint8).reshape(4 * rows, 4 * cols, 4)
    return np.ascontiguousarray(out[..., [2, 1, 0, 3]])


def decode_blocks(blocks: np.ndarray, fmt: TexelFormat) -> np.ndarray:
    """(n, block bytes) separate blocks -> (n, 4, 4, 4) RGBA (uint8; float32 for BC6H), decoded as one
    strip of blocks."""
    n = blocks.shape[0]
    strip = decode_grid(blocks.reshape(1, n, -1), fmt)  # (4, 4n, 4)
    return np.ascontiguousarray(strip.reshape(4, n, 4, 4).transpose(1, 0, 2, 3))


def decode_level(level: BlockLevel, fmt: TexelFormat) -> np.ndarray:
    """A whole level's texels, (height, width, 4) RGBA uint8 (float32 for BC6H; the blocks' padding cut off)."""
    return np.ascontiguousarray(decode_grid(level.blocks, fmt)[: level.height, : level.width])
