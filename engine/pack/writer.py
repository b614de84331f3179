"""Writes a pack atomically: a temporary file in the target folder, fsynced, then renamed.

Tiles may arrive in any order (parallel bakes finish out of order); the index is filled as they
come and written last, together with the header. An exception, Ctrl-C or SIGTERM (turned into
SystemExit by the CLI) removes the temporary file, so the output path never holds a partial pack.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from types import TracebackType

import numpy as np

from ..errors import EngineError
from . import codec
from .format import (
    HEADER_SIZE,
    INDEX_DTYPE,
    MAX_METADATA,
    PackHeader,
    pack_header_bytes,
)

log = logging.getLogger(__name__)


class PackWriter:
    """Collects tiles into a new pack; use as a context manager or call commit()/abort()."""

    def __init__(self, path: str | os.PathLike[str], header: PackHeader, metadata: dict | None = None) -> None:
        self.path = Path(path)
        self.header = header
        self.metadata = dict(metadata or {})
        parent = self.path.parent if str(self.path.parent) else Path(".")
        if not parent.is_dir():
            raise EngineError(f"output folder {parent} does not exist")
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=parent)
        self._tmp = Path(tmp)
        self._file = os.fdopen(fd, "w+b", buffering=1 << 20)
        self._index = np.zeros(header.tile_count, INDEX_DTYPE)
        self._written = np.zeros(header.tile_count, bool)
        self._pos = header.payload_offset
        self._done = False
        try:
            self._file.write(b"\0" * header.payload_offset)  # header, level table, index: filled at commit
        except BaseException:
            self.abort()
            raise

    # ---- tiles ----------------------------------------------------------------------------------
    def add_tile(self, level: int, x: int, y: int, raw: bytes | memoryview) -> None:
        """Add one tile from its raw texel bytes (supercompressed and checksummed here)."""
        stored, digest = codec.encode(raw, self.header.supercompression)
        self.add_encoded(level, x, y, stored, len(raw), digest)

    def add_encoded(self, level: int, x: int, y: int, stored: bytes, raw_size: int, digest: int) -> None:
        """Add one tile already supercompressed (by a worker process) with its raw checksum."""
        if self._done:
            raise RuntimeError("pack writer is closed")
        if raw_size != self.header.tile_raw_size:
            raise ValueError(f"tile ({level}, {x}, {y}) has {raw_size} raw bytes, expected {self.header.tile_raw_size}")
        if not 0 < len(stored) <= self.header.supercompression.stored_bound(raw_size):
            raise ValueError(f"tile ({level}, {x}, {y}) stored size {len(stored)} is out of range")
        i = self.header.tile_index(level, x, y)
        if self._written[i]:
            raise ValueError(f"tile ({level}, {x}, {y}) was added twice")
        align = self.header.alignment
        pad = -self._pos % align
        if pad:
            self._file.write(b"\0" * pad)
            self._pos += pad
        self._file.write(stored)
        self._index[i] = (self._pos, len(stored), raw_size, digest)
        self._written[i] = True
        self._pos += len(stored)

    @property
    def tiles_written(self) -> int:
        return int(self._written.sum())

    # ---- finish ---------------------------------------------------------------------------------
    def commit(self) -> Path:
        """Write index, metadata and header, fsync, and rename onto the output path."""
        if self._done:
            raise RuntimeError("pack writer is closed")
        try:
            missing = np.flatnonzero(~self._written)
            if missing.size:
                raise EngineError(f"pack is incomplete: {missing.size} of {self._written.size} tiles missing")
            meta = json.dumps(self.metadata, sort_keys=True, separators=(",", ":")).encode()
            if len(meta) > MAX_METADATA:
                raise ValueError(f"metadata is {len(meta)} bytes, over the {MAX_METADATA}-byte cap")
            payload_end = self._pos
            f = self._file
            f.write(meta)
            index_bytes = self._index.tobytes()
            level_bytes = self.header.level_table.tobytes()
            head = pack_header_bytes(
                self.header,
                metadata_offset=payload_end,
                metadata_size=len(meta),
                payload_end=payload_end,
                index_checksum=codec.checksum(index_bytes),
                level_checksum=codec.checksum(level_bytes),
            )
            f.seek(0)
            f.write(head)
            f.write(level_bytes)
            assert f.tell() == self.header.index_offset
            f.write(index_bytes)
            assert f.tell() <= self.header.payload_offset and len(head) == HEADER_SIZE
            f.flush()
            os.fsync(f.fileno())
            f.close()
            os.replace(self._tmp, self.path)
            self._done = True
            _fsync_dir(self.path.parent)
        except BaseException:
            self.abort()
            raise
        log.info("wrote %s: %d tiles, %d bytes", self.path, self.header.tile_count, payload_end + len(meta))
        return self.path

    def abort(self) -> None:
        """Drop the temporary file; the output path is left as it was. Idempotent."""
        if self._done:
            return
        self._done = True
        try:
            self._file.close()
        except OSError:
            pass
        try:
            self._tmp.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> PackWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder if str(folder) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
