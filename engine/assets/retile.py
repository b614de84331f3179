"""Re-tile a DDS/KTX2 file's blocks into a pack without re-encoding them.

Every pack level whose size equals one of the file's levels is *copied*: the content blocks of its
tiles are the file's blocks, bit for bit, and so are the borders that lie inside the level (a border
is whole blocks, because tile size and border are multiples of 4). Under wrap, when the level's size
is a multiple of 4, the borders past an edge are whole blocks from the opposite side, copied too.

What cannot be copied is built: blocks past a level's true edge (the border of an edge tile, the
padding of a partial last tile, and, when the size is not a multiple of 4, every block past the last
partial one) hold the clamped or wrapped texels the format prescribes. Those texels come from
decoding only the file blocks they are read from (texture2ddecoder; BC6H to its half floats through
imagecodecs), and only those padding blocks are encoded, with the baker's encoder. The last partial
block of a level (size not a multiple of 4) is the file's own block: its texels inside the level are
content and stay bit-identical, so the texels it holds past the true edge are whatever the file's
encoder put there.

The pack's geometry halves sizes by rounding up; DDS and KTX2 round down. Where the two differ (odd
sizes) or the file has fewer levels than the pack, a level is *generated* from the pack level above
it (decoded, or kept in float32 linear light when it was generated too; BC6H always in float32) with
the baker's mip filter (`bake.mips`), encoded block by block, then tiled like a copied level. The
pack's metadata lists the copied and the generated levels. File levels smaller than the pack's last
level (which fits in one tile) are not needed and are left out.
"""

from __future__ import annotations

import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..bake.bcn import BC7_QUALITIES, encode_slot
from ..bake.format_choice import MIP_FILTER
from ..bake.mips import Transfer, reduce_level
from ..bake.tiler import resolve
from ..errors import SourceError
from ..pack import codec
from ..pack.format import MAX_BORDER, TILE_SIZES, AddressMode, PackHeader, Supercompression, TexelFormat
from ..pack.writer import EncodedTiles, PackWriter
from .blocks import BlockTexture, block_grid, decode_blocks, decode_level, require_float_decoder

log = logging.getLogger(__name__)

ENCODE_CHUNK_BLOCKS = 64  # blocks a side of one encoder call (a 256^2-texel slot): bounded temporaries


@dataclass(frozen=True, kw_only=True)
class RetileConfig:
    """How a block file becomes a pack.

    Attributes
    ----------
    tile_size, border : int
        pack tile content texels (64, 128 or 256) and border texels (a multiple of 4)
    address_mode : AddressMode
        what borders and padding past a level's edge hold
    supercompression : Supercompression
        per-tile supercompression of the pack
    zstd_level : int
        zstd level when `supercompression` is zstd
    bc7_quality : str
        encoder quality for the padding blocks and generated levels of a BC7 file
    srgb : bool | None
        colour transfer for files that do not record it (legacy DDS FourCC); None: sRGB for colour
        formats. A file that records it (DX10 DDS, KTX2) must not be contradicted.
    jobs : int
        encoder threads for padding blocks and generated levels; 0: every core
    """

    tile_size: int = 128
    border: int = 4
    address_mode: AddressMode = AddressMode.CLAMP
    supercompression: Supercompression = Supercompression.ZSTD
    zstd_level: int = codec.ZSTD_LEVEL
    bc7_quality: str = "normal"
    srgb: bool | None = None
    jobs: int = 0

    def __post_init__(self) -> None:
        if self.tile_size not in TILE_SIZES:
            raise ValueError(f"tile size must be one of {TILE_SIZES}, got {self.tile_size!r}")
        if not (0 <= self.border <= MAX_BORDER and self.border % 4 == 0):
            raise ValueError(f"border must be a multiple of 4 in 0..{MAX_BORDER}, got {self.border!r}")
        if self.bc7_quality not in BC7_QUALITIES:
            raise ValueError(f"bc7 quality must be one of {', '.join(BC7_QUALITIES)}, got {self.bc7_quality!r}")
        if not 1 <= self.zstd_level <= 22:
            raise ValueError(f"zstd level must be in 1..22, got {self.zstd_level!r}")
        if self.jobs < 0:
            raise ValueError(f"jobs must be >= 0 (0: every core), got {self.jobs!r}")
        object.__setattr__(self, "address_mode", AddressMode(self.address_mode))
        object.__setattr__(self, "supercompression", Supercompression(self.supercompression))


@dataclass
class RetileReport:
    """What a re-tiling did: the pack written, which levels were copied or generated, and how many
    padding blocks had to be encoded."""

    out: Path
    header: PackHeader
    levels_copied: list[int] = field(default_factory=list)
    levels_generated: list[int] = field(default_factory=list)
    padding_blocks_encoded: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        h = self.header
        return (
            f"wrote {self.out}: {h.width} x {h.height} {h.texel_format.name.lower()}"
            f"{' sRGB' if h.srgb else ''}, {h.level_count} levels ({len(self.levels_copied)} copied without "
            f"re-encoding, {len(self.levels_generated)} generated), {h.tile_count} tiles, "
            f"{self.padding_blocks_encoded} padding blocks encoded, {self.seconds:.2f} s"
        )


def resolve_srgb(texture: BlockTexture, wanted: bool | None) -> bool:
    """The pack's sRGB flag: the file's when it records one (a contradicting `wanted` is a ValueError)."""
    fmt = texture.texel_format
    if texture.srgb is not None:
        if wanted is not None and wanted != texture.srgb:
            have = "sRGB" if texture.srgb else "linear"
            raise ValueError(f"{texture.path} is {texture.format_name} ({have}); drop --srgb/--linear or match it")
        return texture.srgb
    if wanted is None:
        return fmt.colour
    if wanted and not fmt.colour:
        raise ValueError(f"{fmt.name.lower()} holds linear data and cannot be sRGB")
    return wanted


def pack_header_for(texture: BlockTexture, config: RetileConfig) -> PackHeader:
    try:
        return PackHeader(
            width=texture.width,
            height=texture.height,
            texel_format=texture.texel_format,
            srgb=resolve_srgb(texture, config.srgb),
            tile_size=config.tile_size,
            border=config.border,
            address_mode=config.address_mode,
            supercompression=config.supercompression,
        )
    except ValueError as exc:
        if str(exc).startswith(str(texture.path)):
            raise
        raise SourceError(f"{texture.path}: {exc}") from None


# ---- one level's blocks into tiles ------------------------------------------------------------------
class BlockEncoder:
    """Encodes loose 4x4 blocks of texels with the baker's encoder, several per call, on `threads`
    threads (ispc-texcomp releases the GIL while it encodes). Each call's blocks are a fixed run of
    the input, so the output does not depend on the thread count."""

    def __init__(self, fmt: TexelFormat, srgb: bool, bc7_quality: str, threads: int = 1) -> None:
        self.fmt, self.srgb, self.bc7_quality = fmt, srgb, bc7_quality
        self.threads = max(1, threads)

    def encode(self, texels: np.ndarray) -> np.ndarray:
        """(n, 4, 4, 4) RGBA uint8 (float32 for BC6H) -> (n, block bytes) uint8."""
        n = texels.shape[0]
        out = np.empty((n, self.fmt.block_bytes), np.uint8)
        per_call = ENCODE_CHUNK_BLOCKS * ENCODE_CHUNK_BLOCKS
        starts = range(0, n, per_call)

        def run(start: int) -> None:
            part = texels[start : start + per_call]
            side = math.isqrt(part.shape[0] - 1) + 1
            grid = np.empty((side * side, 4, 4, 4), part.dtype)
            grid[: part.shape[0]] = part
            grid[part.shape[0] :] = part[0]  # filler repeats a real block: no transparent texels that are not there
            slot = np.ascontiguousarray(
                grid.reshape(side, side, 4, 4, 4).transpose(0, 2, 1, 3, 4).reshape(4 * side, 4 * side, 4)
            )
            raw = encode_slot(slot, self.fmt, bc7_quality=self.bc7_quality, srgb=self.srgb, alpha=True)
            out[start : start + part.shape[0]] = np.frombuffer(raw, np.uint8).reshape(side * side, -1)[: part.shape[0]]

        if self.threads == 1 or len(starts) == 1:
            for start in starts:
                run(start)
        else:
            with ThreadPoolExecutor(min(self.threads, len(starts))) as pool:
                list(pool.map(run, starts))  # list(): re-raises the first failure
        return out

    def encode_level(self, level: np.ndarray, mode: AddressMode) -> np.ndarray:
        """A whole (h, w, 4) uint8 level -> its (ceil(h/4), ceil(w/4), block bytes) blocks; texels of the
        last partial blocks past the level's edge follow `mode`."""
        h, w = level.shape[:2]
        rows, cols = block_grid(w, h)
        padded = level[np.ix_(resolve(np.arange(4 * rows), h, mode), resolve(np.arange(4 * cols), w, mode))]
        texels = padded.reshape(rows, 4, cols, 4, 4).transpose(0, 2, 1, 3, 4).reshape(-1, 4, 4, 4)
        return self.encode(texels).reshape(rows, cols, -1)


def _axis_sources(extent: int, offset: int, size: int, blocks: int, mode: AddressMode) -> np.ndarray:
    """For block positions ``offset .. offset + extent - 1`` along one axis of a level `size` texels
    (`blocks` blocks) long: the file block that holds exactly that block's texels, or -1 when it has
    to be built (past the edge, unless wrap lands on whole blocks)."""
    c = np.arange(offset, offset + extent)
    if mode is AddressMode.WRAP and size % 4 == 0:
        return np.mod(c, blocks)
    return np.where((c >= 0) & (c < blocks), c, -1)


def tile_level(
    blocks: np.ndarray, width: int, height: int, header: PackHeader, encoder: BlockEncoder
) -> tuple[np.ndarray, int]:
    """Lay one level's blocks out as the pack's slots.

    Returns ``(slots, built)``: slots is a (tiles_y, tiles_x, S/4, S/4, block bytes) uint8 view (each
    tile's bytes are one ``slots[y, x].tobytes()``, a copy); `built` is the number of padding blocks
    that were decoded and encoded.
    """
    fmt, mode = header.texel_format, header.address_mode
    t4, b4, s4 = header.tile_size // 4, header.border // 4, header.slot_size // 4
    rows, cols = blocks.shape[:2]
    tx, ty = -(-width // header.tile_size), -(-height // header.tile_size)
    # The level seen as one grid of blocks from -B/4 to the end of the last tile's border: every slot
    # is a window of it, and neighbouring slots share their border blocks.
    ey, ex = ty * t4 + 2 * b4, tx * t4 + 2 * b4
    row_src = _axis_sources(ey, -b4, height, rows, mode)
    col_src = _axis_sources(ex, -b4, width, cols, mode)
    ext = np.empty((ey, ex, fmt.block_bytes), np.uint8)
    good_r, good_c = row_src >= 0, col_src >= 0
    ext[np.ix_(good_r, good_c)] = blocks[np.ix_(row_src[good_r], col_src[good_c])]
    built = ~(good_r[:, None] & good_c[None, :])
    by, bx = np.nonzero(built)
    if by.size:
        # Texel coordinates of each block to build, resolved into the level by the address mode.
        tr = resolve(4 * (by[:, None] - b4) + np.arange(4), height, mode)  # (n, 4)
        tc = resolve(4 * (bx[:, None] - b4) + np.arange(4), width, mode)
        trr = np.broadcast_to(tr[:, :, None], (by.size, 4, 4))
        tcc = np.broadcast_to(tc[:, None, :], (by.size, 4, 4))
        # Decode only the file blocks those texels lie in.
        keys = (trr // 4) * cols + tcc // 4
        needed, where = np.unique(keys, return_inverse=True)
        decoded = decode_blocks(blocks.reshape(-1, fmt.block_bytes)[needed], fmt)  # (m, 4, 4, 4)
        texels = decoded[where.reshape(keys.shape), trr % 4, tcc % 4]  # (n, 4, 4, 4)
        ext[by, bx] = encoder.encode(np.ascontiguousarray(texels))
    windows = np.lib.stride_tricks.sliding_window_view(ext, (s4, s4), axis=(0, 1))[::t4, ::t4]
    return windows.transpose(0, 1, 3, 4, 2), int(by.size)  # a view: no second copy of the level


# ---- the whole file ---------------------------------------------------------------------------------
def retile_to_pack(texture: BlockTexture, out: str | Path, config: RetileConfig | None = None) -> RetileReport:
    """Write `texture` as a pack at `out` (atomically, through PackWriter); see the module docstring.

    Parameters
    ----------
    texture
        a parsed file (`read_block_file`)
    out
        the pack to write
    config
        tile geometry, address mode, supercompression, encoder settings for what is built

    Returns
    -------
    RetileReport
        which levels were copied and which generated, and how many padding blocks were encoded

    Raises
    ------
    SourceError
        the texture cannot make a pack (too large, too many levels)
    ValueError
        `config.srgb` contradicts what the file records
    """
    from ..version import __version__

    config = config or RetileConfig()
    start = time.perf_counter()
    out = Path(out)
    header = pack_header_for(texture, config)
    fmt = header.texel_format
    # Checked up front, not when the first built block needs it: nearly every BC6H pack builds some
    # (clamped borders, partial tiles, generated levels), and this way nothing is half written.
    require_float_decoder(texture.path, fmt)
    report = RetileReport(out=out, header=header)
    encoder = BlockEncoder(fmt, header.srgb, config.bc7_quality, config.jobs or os.cpu_count() or 1)
    metadata = {
        "tool": f"texstream {__version__}",
        "source": texture.path.name,
        "source_container": texture.container,
        "source_format": texture.format_name,
        "source_levels": len(texture.levels),
        "format": fmt.name.lower(),
        "srgb": header.srgb,
        "tile_size": header.tile_size,
        "border": header.border,
        "address_mode": header.address_mode.name.lower(),
        "supercompression": header.supercompression.name.lower(),
        "mip_filter": MIP_FILTER,
    }
    if header.supercompression is Supercompression.ZSTD:
        metadata["zstd_level"] = config.zstd_level
    previous: np.ndarray | None = None  # the level above, as texels: uint8 (decoded) or float32 (generated)
    previous_file: int | None = None  # ... or still as the file's level, decoded only when needed
    with PackWriter(out, header, metadata) as writer:
        for level in range(header.level_count):
            w, h = header.level_dims(level)
            if _file_has(texture, level, w, h):
                blocks = texture.levels[level].blocks
                report.levels_copied.append(level)
                previous, previous_file = None, level
            else:
                if previous is None:
                    assert previous_file is not None  # level 0 always comes from the file
                    previous = decode_level(texture.levels[previous_file], fmt)
                transfer = _transfer(fmt, header.srgb, previous)
                linear = reduce_level(previous, transfer, header.address_mode)
                texels = transfer.encode(linear)
                blocks = encoder.encode_level(texels, header.address_mode)
                report.levels_generated.append(level)
                previous, previous_file = linear, None
            slots, built = tile_level(blocks, w, h, header, encoder)
            report.padding_blocks_encoded += built
            batch = EncodedTiles()
            for y in range(slots.shape[0]):
                for x in range(slots.shape[1]):
                    stored, digest = codec.encode(slots[y, x].tobytes(), header.supercompression, config.zstd_level)
                    batch.add(level, x, y, stored, digest)
            writer.add_encoded_batch(batch)
        writer.metadata["levels_copied"] = report.levels_copied
        writer.metadata["levels_generated"] = report.levels_generated
        writer.metadata["padding_blocks_encoded"] = report.padding_blocks_encoded
    report.seconds = time.perf_counter() - start
    log.info("%s", report.summary())
    return report


def _file_has(texture: BlockTexture, level: int, width: int, height: int) -> bool:
    """The file's level `level` has the pack level's size. Floor and ceil halving agree at level l when
    2^l divides the size, and again once both reach 1 texel (a 1024 x 3 file's level 2 is 256 x 1 in
    both), so a copied level can follow a generated one."""
    return level < len(texture.levels) and (texture.levels[level].width, texture.levels[level].height) == (
        width,
        height,
    )


def _transfer(fmt: TexelFormat, srgb: bool, level: np.ndarray) -> Transfer:
    """The baker's filter for this data: colour with real alpha filtered premultiplied; BC6H in
    float32 linear light, kept unrounded from level to level."""
    if fmt.float_texels:
        return Transfer(srgb=False, alpha=False, float_texels=True)
    if fmt in (TexelFormat.BC3, TexelFormat.BC7):
        alpha = bool((level[..., 3] < 255).any()) if level.dtype == np.uint8 else bool((level[..., 3] < 1.0).any())
    else:
        alpha = False
    return Transfer(srgb=srgb, alpha=alpha, premultiplied=alpha)
