"""Reads a pack: validates header, level table and index up front, then serves tiles by (level, x, y).

Nothing read from the file is trusted before it is checked: sizes are compared with what the header
implies and with the file's real size before any buffer is allocated; the index is checked as a
whole (vectorized) for alignment, bounds, overlaps and raw sizes. `read_tile` uses `os.pread`, so
any number of threads may read at once without a shared file position.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np

from ..errors import PackFormatError, TileCorruptError
from . import codec
from .format import (
    HEADER_SIZE,
    INDEX_DTYPE,
    LEVEL_DTYPE,
    PackHeader,
    Supercompression,
    parse_header_bytes,
)


@dataclass(frozen=True)
class TileEntry:
    """One index entry: where a tile lies and how to check it."""

    offset: int
    stored_size: int
    raw_size: int
    checksum: int


class PackReader:
    """An open pack file. Thread-safe for reads; `close()` is idempotent."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise PackFormatError(f"pack {self.path} does not exist") from None
        except IsADirectoryError:
            raise PackFormatError(f"pack {self.path} is a folder, not a file") from None
        except OSError as exc:
            raise PackFormatError(f"cannot open pack {self.path}: {exc.strerror}") from None
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    def _load(self) -> None:
        try:
            st = os.fstat(self._fd)
        except OSError as exc:
            raise PackFormatError(f"cannot stat pack {self.path}: {exc.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            raise PackFormatError(f"pack {self.path} is a folder, not a file")
        self.file_size = st.st_size
        raw = parse_header_bytes(self._pread(min(HEADER_SIZE, self.file_size), 0), self.file_size)
        h = self.header = raw.header
        # Level table: must equal what the header's geometry implies.
        level_bytes = self._pread(h.level_count * LEVEL_DTYPE.itemsize, HEADER_SIZE)
        if codec.checksum(level_bytes) != raw.level_checksum:
            raise PackFormatError("level table checksum mismatch")
        table = np.frombuffer(level_bytes, LEVEL_DTYPE)
        expect = h.level_table
        for lv in range(h.level_count):
            for field in LEVEL_DTYPE.names:
                if table[lv][field] != expect[lv][field]:
                    raise PackFormatError(
                        f"level {lv} {field} is {int(table[lv][field])}, expected {int(expect[lv][field])}"
                    )
        # Index: its size was bounded by the file size in parse_header_bytes (index < payload <= file).
        index_bytes = self._pread(h.tile_count * INDEX_DTYPE.itemsize, h.index_offset)
        if codec.checksum(index_bytes) != raw.index_checksum:
            raise PackFormatError("index checksum mismatch")
        self._index = np.frombuffer(index_bytes, INDEX_DTYPE)
        self._validate_index(raw.payload_end)
        self.payload_end = raw.payload_end
        self.metadata = self._load_metadata(raw.metadata_offset, raw.metadata_size)

    def _validate_index(self, payload_end: int) -> None:
        h, idx = self.header, self._index
        off = idx["offset"]
        stored = idx["stored_size"].astype(np.uint64)
        checks = (
            (idx["raw_size"] != h.tile_raw_size, "raw size", idx["raw_size"], f"!= {h.tile_raw_size}"),
            (stored == 0, "stored size", idx["stored_size"], "is zero"),
            (stored > h.supercompression.stored_bound(h.tile_raw_size), "stored size", idx["stored_size"],
             "exceeds the codec bound"),
            (off % np.uint64(h.alignment) != 0, "offset", off, f"is not {h.alignment}-aligned"),
            (off < np.uint64(h.payload_offset), "offset", off, "is before the payload"),
            (off > np.uint64(payload_end) - np.minimum(stored, np.uint64(payload_end)), "offset", off,
             "+ stored size runs past the payload end"),
        )  # fmt: skip
        for bad, field, values, why in checks:
            hit = np.flatnonzero(bad)
            if hit.size:
                i = int(hit[0])
                raise PackFormatError(
                    f"tile {self.tile_position(i)} {field} {int(values[i])} {why} ({hit.size} bad entries)"
                )
        if h.supercompression is Supercompression.NONE and np.any(stored != np.uint64(h.tile_raw_size)):
            raise PackFormatError("uncompressed pack has a stored size different from the raw size")
        order = np.argsort(off, kind="stable")
        ends = off[order] + stored[order]
        overlap = np.flatnonzero(ends[:-1] > off[order][1:])
        if overlap.size:
            a, b = int(order[overlap[0]]), int(order[overlap[0] + 1])
            raise PackFormatError(f"tiles {self.tile_position(a)} and {self.tile_position(b)} overlap in the file")

    def _load_metadata(self, offset: int, size: int) -> dict:
        if size == 0:
            return {}
        data = self._pread(size, offset)
        try:
            meta = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PackFormatError(f"metadata is not valid UTF-8 JSON: {exc}") from None
        if not isinstance(meta, dict):
            raise PackFormatError(f"metadata must be a JSON object, got {type(meta).__name__}")
        return meta

    def _pread(self, size: int, offset: int) -> bytes:
        try:
            data = os.pread(self._fd, size, offset)
        except OSError as exc:
            raise PackFormatError(f"cannot read {size} bytes at {offset}: {exc.strerror}") from None
        if len(data) != size:
            raise PackFormatError(f"file ends at {self.file_size}: cannot read {size} bytes at offset {offset}")
        return data

    def fileno(self) -> int:
        """The open file descriptor (for readers that pread tiles themselves, e.g. the I/O threads)."""
        return self._fd

    # ---- lookup ---------------------------------------------------------------------------------
    def tile_position(self, i: int) -> tuple[int, int, int]:
        """(level, x, y) of index entry i."""
        first = self.header.level_first
        lv = int(np.searchsorted(first, i, side="right") - 1)
        tx = int(self.header.level_table[lv]["tiles_x"])
        r = i - int(first[lv])
        return lv, r % tx, r // tx

    def entry(self, level: int, x: int, y: int) -> TileEntry:
        e = self._index[self.header.tile_index(level, x, y)]
        return TileEntry(int(e["offset"]), int(e["stored_size"]), int(e["raw_size"]), int(e["checksum"]))

    @property
    def index(self) -> np.ndarray:
        """The validated index (read-only structured array, INDEX_DTYPE)."""
        return self._index

    # ---- tile reads -----------------------------------------------------------------------------
    def read_stored(self, level: int, x: int, y: int) -> bytes:
        """The tile's bytes exactly as stored (still supercompressed)."""
        e = self.entry(level, x, y)
        try:
            data = os.pread(self._fd, e.stored_size, e.offset)
        except OSError as exc:
            raise TileCorruptError(f"tile ({level}, {x}, {y}) unreadable: {exc.strerror}", level, x, y) from None
        if len(data) != e.stored_size:
            raise TileCorruptError(
                f"tile ({level}, {x}, {y}) truncated: {len(data)} of {e.stored_size} bytes", level, x, y
            )
        return data

    def read_tile(self, level: int, x: int, y: int) -> bytes:
        """The tile's raw texel bytes (BC blocks or RGBA8), checksum verified."""
        out = bytearray(self.header.tile_raw_size)
        self.read_tile_into(level, x, y, memoryview(out))
        return bytes(out)

    def read_tile_into(self, level: int, x: int, y: int, out: memoryview) -> int:
        """Read, decompress and verify one tile straight into `out` (a staging slot); returns its size.

        Uncompressed tiles are read with one preadv into `out`; compressed ones are decoded and copied
        once. Raises TileCorruptError (checksum, truncation, bad codec data) and leaves `out` unspecified.
        """
        e = self.entry(level, x, y)
        if len(out) < e.raw_size:
            raise ValueError(f"output buffer of {len(out)} bytes is smaller than the tile ({e.raw_size})")
        target = out[: e.raw_size]
        if self.header.supercompression is Supercompression.NONE:
            try:
                n = os.preadv(self._fd, [target], e.offset)
            except OSError as exc:
                raise TileCorruptError(f"tile ({level}, {x}, {y}) unreadable: {exc.strerror}", level, x, y) from None
            if n != e.raw_size:
                raise TileCorruptError(f"tile ({level}, {x}, {y}) truncated: {n} of {e.raw_size} bytes", level, x, y)
        else:
            stored = self.read_stored(level, x, y)
            try:
                target[:] = codec.decompress(stored, self.header.supercompression, e.raw_size)
            except TileCorruptError as exc:
                raise TileCorruptError(f"tile ({level}, {x}, {y}): {exc}", level, x, y) from None
        if codec.checksum(target) != e.checksum:
            raise TileCorruptError(f"tile ({level}, {x}, {y}) checksum mismatch", level, x, y)
        return e.raw_size

    def verify(self) -> list[tuple[int, int, int, str]]:
        """Read every tile; return (level, x, y, reason) for each bad one."""
        bad = []
        buf = memoryview(bytearray(self.header.tile_raw_size))
        for i in range(self.header.tile_count):
            lv, x, y = self.tile_position(i)
            try:
                self.read_tile_into(lv, x, y, buf)
            except TileCorruptError as exc:
                bad.append((lv, x, y, str(exc)))
        return bad

    # ---- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> PackReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


__all__ = ["PackHeader", "PackReader", "TileEntry"]
