"""Per-tile supercompression and checksums, shared by the writer, the reader and bake workers.

zstandard compressor/decompressor objects are not thread-safe, so each thread keeps its own.
"""

from __future__ import annotations

import threading

import lz4.block
import xxhash
import zstandard

from ..errors import TileCorruptError
from .format import Supercompression

ZSTD_LEVEL = 3  # zstd's default: ~3x faster to bake than level 9 for a few % of size on BC data

_local = threading.local()


def checksum(data: bytes | bytearray | memoryview) -> int:
    """xxh3-64 of a tile's raw (decoded, pre-supercompression) bytes."""
    return xxhash.xxh3_64_intdigest(data)


def _zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "zc", None)
    if cache is None:
        cache = _local.zc = {}
    comp = cache.get(level)
    if comp is None:
        comp = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return comp


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "zd", None)
    if d is None:
        d = _local.zd = zstandard.ZstdDecompressor()
    return d


def compress(raw: bytes | memoryview, mode: Supercompression, zstd_level: int = ZSTD_LEVEL) -> bytes:
    """Supercompress one tile's raw bytes."""
    if mode is Supercompression.NONE:
        return bytes(raw)
    if mode is Supercompression.ZSTD:
        return _zstd_compressor(zstd_level).compress(raw)
    return lz4.block.compress(raw, store_size=False)


def encode(raw: bytes | memoryview, mode: Supercompression, zstd_level: int = ZSTD_LEVEL) -> tuple[bytes, int]:
    """(stored bytes, checksum of raw) for one tile: what the writer's index records."""
    return compress(raw, mode, zstd_level), checksum(raw)


def decompress(stored: bytes | memoryview, mode: Supercompression, raw_size: int) -> bytes | memoryview:
    """Undo `compress`; raises TileCorruptError if the data does not decode to exactly raw_size bytes."""
    if mode is Supercompression.NONE:
        if len(stored) != raw_size:
            raise TileCorruptError(f"stored size {len(stored)} differs from raw size {raw_size}")
        return stored
    try:
        if mode is Supercompression.ZSTD:
            params = zstandard.get_frame_parameters(stored)
            if params.content_size != raw_size:
                raise TileCorruptError(f"zstd frame declares {params.content_size} bytes, expected {raw_size}")
            out = _zstd_decompressor().decompress(stored, max_output_size=raw_size)
        else:
            out = lz4.block.decompress(stored, uncompressed_size=raw_size)
    except TileCorruptError:
        raise
    except Exception as exc:  # the codecs raise their own error types on bad input
        raise TileCorruptError(f"{mode.name.lower()} data does not decode: {exc}") from None
    if len(out) != raw_size:
        raise TileCorruptError(f"tile decodes to {len(out)} bytes, expected {raw_size}")
    return out
