"""Per-tile supercompression and checksums, shared by the writer, the reader and bake workers.

zstandard compressor/decompressor objects are not thread-safe, so each thread keeps its own.
"""

from __future__ import annotations

import struct
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


def encode_many(
    raw: bytes | memoryview, raw_size: int, mode: Supercompression, zstd_level: int = ZSTD_LEVEL
) -> tuple[list[bytes], list[int]]:
    """`encode` of each `raw_size`-byte tile of `raw` (tiles back to back): the same stored bytes
    and checksums, with zstd compressing them all in one call (python-zstandard's
    multi_compress_to_buffer sizes each frame's tables to its tile; one `compress` call per tile
    resets tables sized for any input, about five times the work on a 9 KiB tile)."""
    view = memoryview(raw).cast("B")
    n = len(view) // raw_size if raw_size > 0 else 0
    if n * raw_size != len(view):
        raise ValueError(f"{len(view)} bytes are not whole tiles of {raw_size} bytes")
    digests = _checksums(view, n, raw_size)
    if mode is Supercompression.ZSTD and n > 1:
        comp = _zstd_compressor(zstd_level)
        try:
            segments = struct.pack(f"<{2 * n}Q", *_segments(n, raw_size))
            frames = comp.multi_compress_to_buffer(zstandard.BufferWithSegments(view, segments), threads=0)
            return [f.tobytes() for f in frames], digests
        except (AttributeError, NotImplementedError):  # a python-zstandard backend without it (cffi)
            pass
    return [compress(view[i * raw_size : (i + 1) * raw_size], mode, zstd_level) for i in range(n)], digests


def _segments(n: int, size: int) -> list[int]:
    """(offset, length) of `n` back-to-back tiles of `size` bytes, flattened."""
    flat = [size] * (2 * n)
    flat[0::2] = range(0, n * size, size)
    return flat


def _checksums(view: memoryview, n: int, size: int) -> list[int]:
    """`checksum` of each of the `n` tiles of `view`: in one compiled call where the helper is built."""
    from ..native import checksum_tiles

    batch = checksum_tiles()
    if batch is not None and n > 1:
        return batch(view, n, size).tolist()
    return [checksum(view[i * size : (i + 1) * size]) for i in range(n)]


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
