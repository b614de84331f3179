"""Writes a pack atomically: a temporary file in the target folder, fsynced, then renamed.

Tiles may arrive in any order (parallel bakes finish out of order); the index is filled as they
come and written last, together with the header. An exception, Ctrl-C or SIGTERM (turned into
SystemExit by the CLI) removes the temporary file, so the output path never holds a partial pack.

The temporary file is ``.<name>.<pid>.<random>.tmp`` beside the output. A writer that was killed
outright (SIGKILL, power loss) cannot remove its own, so each new writer for the same output removes
the temporary files whose process is gone; a live process's are never touched. The finished file
gets the mode a plain ``open()`` would give it (0666 less the umask), not mkstemp's 0600.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import numpy as np

from .. import _io
from ..errors import EngineError
from . import codec
from .format import (
    HEADER_SIZE,
    INDEX_DTYPE,
    MAX_METADATA,
    PackHeader,
    pack_header_bytes,
    position_mix,
)

log = logging.getLogger(__name__)


@dataclass
class EncodedTiles:
    """Supercompressed tiles with their raw checksums, as parallel lists (a bake band's output)."""

    levels: list[int] = field(default_factory=list)
    xs: list[int] = field(default_factory=list)
    ys: list[int] = field(default_factory=list)
    stored: list[bytes] = field(default_factory=list)
    digests: list[int] = field(default_factory=list)  # xxh3-64 of each raw tile

    def add(self, level: int, x: int, y: int, stored: bytes, digest: int) -> None:
        self.levels.append(level)
        self.xs.append(x)
        self.ys.append(y)
        self.stored.append(stored)
        self.digests.append(digest)

    def add_row(self, level: int, y: int, stored: list[bytes], digests: list[int]) -> None:
        """Tiles x = 0, 1, ... of tile row `y` of `level`."""
        n = len(stored)
        self.levels.extend([level] * n)
        self.xs.extend(range(n))
        self.ys.extend([y] * n)
        self.stored.extend(stored)
        self.digests.extend(digests)

    def __len__(self) -> int:
        return len(self.stored)

    def packed(self, alignment: int, into: memoryview | None = None) -> PackedTiles:
        """The same tiles as one payload laid out as `PackWriter` writes them (each tile padded
        with zeros to a multiple of `alignment`, the last one not), with their coordinates, sizes
        and checksums as arrays: one write for the writer, and a small pickle between processes.

        `into`: a buffer (shared memory) to lay the payload out in when it fits; the result then
        says how long it is (`PackedTiles.outside`) and carries no bytes itself."""
        n = len(self.stored)
        sizes = np.fromiter(map(len, self.stored), np.int64, n)
        pads = -sizes % alignment
        if n:
            pads[-1] = 0  # the last tile is not padded
        total = int(sizes.sum() + pads.sum())
        zeros = b"\0" * alignment
        parts: list[bytes] = [b""] * (2 * n)  # each tile, then its padding: one join, no loop over tiles
        parts[0::2] = self.stored
        parts[1::2] = [zeros[:p] for p in pads.tolist()]
        payload = b"".join(parts)
        outside = -1
        if into is not None and total <= len(into):
            into[:total] = payload
            payload, outside = b"", total
        return PackedTiles(
            levels=np.asarray(self.levels, np.int64),
            xs=np.asarray(self.xs, np.int64),
            ys=np.asarray(self.ys, np.int64),
            sizes=sizes,
            digests=np.asarray(self.digests, np.uint64),
            payload=payload,
            alignment=alignment,
            outside=outside,
        )


@dataclass(frozen=True, kw_only=True)
class PackedTiles:
    """Supercompressed tiles as one payload (`EncodedTiles.packed`): tile k's stored bytes start
    at the sum of the earlier tiles' sizes rounded up to `alignment`."""

    levels: np.ndarray  # int64
    xs: np.ndarray
    ys: np.ndarray
    sizes: np.ndarray  # int64 stored sizes
    digests: np.ndarray  # uint64 xxh3-64 of each raw tile
    payload: bytes | memoryview
    alignment: int
    outside: int = -1  # >= 0: the payload (this many bytes) lies in a buffer the tiles' maker named

    def __len__(self) -> int:
        return int(self.sizes.size)


WRITEBACK_BYTES = 8 << 20
"""Written bytes after which the writer asks the kernel to start writing them to disk (Linux's
sync_file_range, without waiting): the fsync of `commit` then finds most of the pack on disk
already, instead of writing all of it while the bake waits (30-45 ms of a 37 MiB pack on the
2-core box)."""


@functools.cache
def _sync_file_range() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def start_writeback(fd: int, start: int, end: int) -> int:
    """Start writing bytes [start, end) of `fd` to disk, not waiting (an advice: where the system
    has no such call, or it fails, nothing happens); returns `end`. Bytes still in a buffer of the
    file object are not written yet: they go with a later call, or with the final fsync."""
    fn = _sync_file_range()
    if fn is not None and end > start:
        fn(fd, start, end - start, 2)  # SYNC_FILE_RANGE_WRITE
    return end


def open_buffered(fd: int) -> BinaryIO:
    """The temporary file's descriptor as the buffered file the writer writes through."""
    return _io.fdopen(fd, "w+b", buffering=1 << 20)


class PackWriter:
    """Collects tiles into a new pack; use as a context manager or call commit()/abort().

    A failed write, flush, fsync or rename (a full disk, a quota, an I/O error) raises one
    `EngineError` naming the output and its temporary file, after removing that file.
    `open_file` turns the temporary file's descriptor into the file written through (tests inject
    write failures there)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        header: PackHeader,
        metadata: dict | None = None,
        *,
        open_file: Callable[[int], BinaryIO] = open_buffered,
    ) -> None:
        self.path = Path(path)
        self.header = header
        self.metadata = dict(metadata or {})
        # Everything sized by the header first: a failure here leaves no file behind.
        self._index = np.zeros(header.tile_count, INDEX_DTYPE)
        self._written = np.zeros(header.tile_count, bool)
        self._pos = header.payload_offset
        self._written_back = 0  # payload bytes whose writeback to disk was started
        self._done = False
        fd, self._tmp = create_temp(self.path)
        try:
            self._file = open_file(fd)
        except BaseException:
            os.close(fd)
            self._tmp.unlink(missing_ok=True)
            raise
        try:
            with self._writing():
                self._file.write(b"\0" * header.payload_offset)  # header, level table, index: filled at commit
        except BaseException:
            self.abort()
            raise

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """An OSError in the block becomes one line naming the output and its temporary file (which
        is removed): a bare "No space left on device" does not say where."""
        try:
            yield
        except OSError as exc:
            self.abort()
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise EngineError(
                f"cannot write {self.path}: {reason} (writing its temporary file {self._tmp.name}, removed)"
            ) from None

    # ---- tiles ----------------------------------------------------------------------------------
    def add_tile(self, level: int, x: int, y: int, raw: bytes | memoryview) -> None:
        """Add one tile from its raw texel bytes (supercompressed and checksummed here)."""
        stored, digest = codec.encode(raw, self.header.supercompression)
        self.add_encoded(level, x, y, stored, len(raw), digest)

    def add_encoded(self, level: int, x: int, y: int, stored: bytes, raw_size: int, digest: int) -> None:
        """Add one tile already supercompressed (by a worker process) with its raw checksum."""
        if raw_size != self.header.tile_raw_size:
            raise ValueError(f"tile ({level}, {x}, {y}) has {raw_size} raw bytes, expected {self.header.tile_raw_size}")
        one = EncodedTiles()
        one.add(level, x, y, stored, digest)
        self.add_encoded_batch(one)

    def add_encoded_batch(self, tiles: EncodedTiles | PackedTiles) -> None:
        """Add many supercompressed tiles at once (a bake band's): the same checks as `add_encoded`,
        over arrays, and one write for their payloads (`PackedTiles` come laid out already)."""
        if self._done:
            raise RuntimeError("pack writer is closed")
        n = len(tiles)
        if n == 0:
            return
        h = self.header
        if isinstance(tiles, PackedTiles) and tiles.outside >= 0:
            raise ValueError("packed tiles without their payload (it lies outside them)")
        if isinstance(tiles, PackedTiles) and tiles.alignment != h.alignment:
            raise ValueError(f"tiles packed at alignment {tiles.alignment}, the pack's is {h.alignment}")
        level = np.asarray(tiles.levels, np.int64)
        x, y = np.asarray(tiles.xs, np.int64), np.asarray(tiles.ys, np.int64)
        if level.min() < 0 or level.max() >= h.level_count:
            raise ValueError(f"tile levels out of range 0..{h.level_count - 1}")
        tx, ty = h.level_table["tiles_x"].astype(np.int64)[level], h.level_table["tiles_y"].astype(np.int64)[level]

        def first(bad: np.ndarray) -> str:
            k = int(np.flatnonzero(bad)[0])
            return f"tile ({int(level[k])}, {int(x[k])}, {int(y[k])})"

        outside = (x < 0) | (x >= tx) | (y < 0) | (y >= ty)
        if outside.any():
            raise ValueError(f"{first(outside)} does not exist")
        index = h.level_first.astype(np.int64)[level] + y * tx + x
        if isinstance(tiles, PackedTiles):
            sizes = np.asarray(tiles.sizes, np.int64)
        else:
            sizes = np.fromiter((len(b) for b in tiles.stored), np.int64, n)
        bad_size = (sizes <= 0) | (sizes > h.supercompression.stored_bound(h.tile_raw_size))
        if bad_size.any():
            raise ValueError(f"{first(bad_size)} stored size is out of range")
        order = np.argsort(index, kind="stable")
        repeated = np.zeros(n, bool)
        repeated[order[1:]] = index[order[1:]] == index[order[:-1]]
        twice = self._written[index] | repeated
        if twice.any():
            raise ValueError(f"{first(twice)} was added twice")
        align = h.alignment
        padded = -(-sizes // align) * align  # each payload starts aligned (pad before the next one)
        start = self._pos + (-self._pos % align)
        offsets = start + np.concatenate([[0], np.cumsum(padded[:-1])])
        if isinstance(tiles, PackedTiles):
            if len(tiles.payload) != int(offsets[-1] - start + sizes[-1]):
                raise ValueError(f"packed payload is {len(tiles.payload)} bytes, its tiles' sizes say otherwise")
            with self._writing():
                self._file.write(b"\0" * (start - self._pos))
                self._file.write(tiles.payload)
        else:
            pads = padded - sizes
            parts: list[bytes] = [b"\0" * (start - self._pos)]
            for blob, pad in zip(tiles.stored, pads.tolist(), strict=True):
                parts.append(blob)
                parts.append(b"\0" * pad)
            parts.pop()  # no padding after the last one: the next write pads as it needs
            with self._writing():
                self._file.write(b"".join(parts))
        entries = self._index[index]
        entries["offset"], entries["stored_size"] = offsets, sizes
        entries["raw_size"], entries["checksum"] = h.tile_raw_size, np.asarray(tiles.digests, np.uint64)
        self._index[index] = entries
        self._written[index] = True
        self._pos = int(offsets[-1] + sizes[-1])
        if self._pos - self._written_back >= WRITEBACK_BYTES:
            self._written_back = start_writeback(self._file.fileno(), self._written_back, self._pos)

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
            with self._writing():
                self._write_tail(meta, payload_end)
        except BaseException:
            self.abort()
            raise
        log.info("wrote %s: %d tiles, %d bytes", self.path, self.header.tile_count, payload_end + len(meta))
        return self.path

    def _write_tail(self, meta: bytes, payload_end: int) -> None:
        """Metadata, index, level table and header; flushed, fsynced and renamed onto the output."""
        f = self._file
        f.write(meta)
        stored = self._index.copy()  # version 2: each check binds the tile's position
        stored["checksum"] ^= position_mix(np.arange(stored.size, dtype=np.int64))
        index_bytes = stored.tobytes()
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
        _io.fchmod(f.fileno(), output_mode())
        _io.fsync(f.fileno())
        f.close()
        _io.replace(self._tmp, self.path)
        self._done = True
        _io.sync_folder(self.path.parent)

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


def output_mode() -> int:
    """0666 less the process's umask: the mode `open()` would have given a new file."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)  # no /proc: read it by setting it, and put it back at once
    os.umask(mask)
    return 0o666 & ~mask


def _temp_pattern(path: Path) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.[^.]+\.tmp")


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove the temporary files of writers of `path` whose process no longer exists."""
    folder = path.parent if str(path.parent) else Path(".")
    pattern = _temp_pattern(path)
    removed = []
    try:
        names = [e.name for e in os.scandir(folder) if e.name.startswith(f".{path.name}.")]
    except OSError:
        return removed
    for name in names:
        m = pattern.fullmatch(name)
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        try:
            (folder / name).unlink()
        except OSError:
            continue
        log.warning("removed %s, left by an interrupted writer (process %s)", folder / name, m.group(1))
        removed.append(folder / name)
    return removed


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process id a writer could have had: leave the file alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's live process (or unknowable): keep its file
    return True


def create_temp(path: Path) -> tuple[int, Path]:
    """Open a new temporary file ``.<name>.<pid>.<random>.tmp`` beside `path` (after removing those
    of dead writers of `path`); returns its descriptor and path. EngineError (naming `path`) if the
    folder is missing or not writable."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise EngineError(f"output folder {folder} does not exist")
    remove_stale_temps(path)
    try:
        fd, tmp = _io.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=folder)
    except OSError as exc:  # name the output the user gave, not the hidden temporary file
        raise EngineError(f"cannot write {path}: {exc.strerror or exc}") from None
    return fd, Path(tmp)
