"""Export a pack's levels as a standard KTX2 file, so other tools can read what was baked.

Each level is reassembled from its tiles' content blocks (borders dropped, the blocks past the
level's last partial block dropped), so the KTX2 holds exactly the pack's blocks. BC6H packs export
as ``VK_FORMAT_BC6H_UFLOAT_BLOCK`` with a float sample in the data format descriptor. KTX2 halves mip
sizes by rounding down and the pack by rounding up: the exported chain is the pack's levels up to
the first one whose size differs (all of them for sizes that are powers of two, or multiples of a
large enough power of two). The pack's levels end where a level fits in one tile; KTX2 allows such a
partial chain. The file is written atomically (temporary file, fsync, rename) like a pack.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import _io
from ..errors import EngineError
from ..pack.format import TexelFormat
from ..pack.reader import PackReader
from ..pack.writer import create_temp, output_mode
from .blocks import block_grid, floor_dims
from .ktx2 import SUPERCOMPRESSION_NONE, SUPERCOMPRESSION_ZSTD, ktx2_bytes

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 1 << 30  # the levels are assembled in memory: 1 GiB of blocks (a 32768^2 BC7 texture)
SCHEMES = {"none": SUPERCOMPRESSION_NONE, "zstd": SUPERCOMPRESSION_ZSTD}


@dataclass(frozen=True)
class ExportReport:
    out: Path
    levels: int  # levels written
    pack_levels: int
    raw_bytes: int  # level data before supercompression
    file_bytes: int

    def summary(self) -> str:
        left = self.pack_levels - self.levels
        why = f" (the pack's last {left} level(s) have ceil-halved sizes KTX2 cannot describe)" if left else ""
        return f"wrote {self.out}: {self.levels} of {self.pack_levels} levels{why}, {self.file_bytes:,} bytes"


def exportable_levels(width: int, height: int, pack_levels: list[tuple[int, int]]) -> int:
    """How many of the pack's levels, from level 0, have the sizes KTX2 gives them."""
    n = 0
    for lv, dims in enumerate(pack_levels):
        if floor_dims(width, height, lv) != dims:
            break
        n += 1
    return n


def level_blocks(reader: PackReader, level: int) -> np.ndarray:
    """One pack level's blocks, (ceil(h/4), ceil(w/4), block bytes), from its tiles' content."""
    h = reader.header
    w_l, h_l = h.level_dims(level)
    tx, ty = h.tiles_in_level(level)
    t4, b4, s4 = h.tile_size // 4, h.border // 4, h.slot_size // 4
    nbytes = h.texel_format.block_bytes
    grid = np.empty((ty * t4, tx * t4, nbytes), np.uint8)
    for y in range(ty):
        for x in range(tx):
            slot = np.frombuffer(reader.read_tile(level, x, y), np.uint8).reshape(s4, s4, nbytes)
            grid[y * t4 : (y + 1) * t4, x * t4 : (x + 1) * t4] = slot[b4 : b4 + t4, b4 : b4 + t4]
    rows, cols = block_grid(w_l, h_l)
    return grid[:rows, :cols]


def export_ktx2(
    pack: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    supercompression: str = "none",
    zstd_level: int = 19,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ExportReport:
    """Write the pack `pack` as a KTX2 file `out` (see the module docstring for which levels).

    Parameters
    ----------
    pack
        the pack to export (a path or URL, as `PackReader` takes)
    out
        the KTX2 file to write, atomically
    supercompression
        "none" (default: what every KTX2 reader takes) or "zstd"
    zstd_level
        Zstandard level when `supercompression` is "zstd"
    max_bytes
        refuse packs whose exported levels hold more bytes of blocks than this (they are assembled
        in memory)

    Returns
    -------
    ExportReport
        the levels written and the file's size

    Raises
    ------
    EngineError
        one line: an rgba8 pack, a pack over `max_bytes`, an unreadable pack (BC1-BC7 and BC6H export)
    """
    from ..version import __version__

    if supercompression not in SCHEMES:
        raise ValueError(f"unknown supercompression {supercompression!r} (choose none or zstd)")
    scheme = SCHEMES[supercompression]
    out = Path(out)
    with PackReader(pack) as reader:
        h = reader.header
        if h.texel_format is TexelFormat.RGBA8:
            raise EngineError(f"{pack}: rgba8 packs are not exported (KTX2 export takes bc1/bc3/bc4/bc5/bc6h/bc7)")
        dims = [h.level_dims(lv) for lv in range(h.level_count)]
        count = exportable_levels(h.width, h.height, dims)
        raw_total = sum(block_grid(*dims[lv])[0] * block_grid(*dims[lv])[1] for lv in range(count))
        raw_total *= h.texel_format.block_bytes
        if raw_total > max_bytes:
            raise EngineError(
                f"{pack}: its levels are {raw_total:,} bytes of blocks, over the {max_bytes:,}-byte export limit "
                f"(raise it with --max-size)"
            )
        levels: list[bytes] = []
        for lv in range(count):
            data = level_blocks(reader, lv).tobytes()
            if scheme == SUPERCOMPRESSION_ZSTD:
                import zstandard

                data = zstandard.ZstdCompressor(level=zstd_level, write_content_size=True).compress(data)
            levels.append(data)
        parts = ktx2_bytes(
            h.texel_format, h.srgb, h.width, h.height, levels, scheme=scheme, writer=f"texstream {__version__}"
        )
    size = write_atomically(out, parts)
    report = ExportReport(out=out, levels=count, pack_levels=len(dims), raw_bytes=raw_total, file_bytes=size)
    log.info("%s", report.summary())
    return report


def write_atomically(path: Path, parts: list[bytes]) -> int:
    """Write `parts` to `path` through a temporary file in the same folder: fsync, rename, fsync the
    folder. On any failure the temporary file is removed and `path` is left as it was."""
    fd, tmp = create_temp(path)
    try:
        with _io.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            _io.fchmod(f.fileno(), output_mode())
            _io.fsync(f.fileno())
        _io.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise EngineError(f"cannot write {path}: {reason} (writing its temporary file {tmp.name}, removed)") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _io.sync_folder(path.parent)
    return sum(len(p) for p in parts)
