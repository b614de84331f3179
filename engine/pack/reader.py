"""Reads a pack: validates header, level table and index up front, then serves tiles by (level, x, y).

Nothing read from the file is trusted before it is checked: sizes are compared with what the header
implies and with the file's real size before any buffer is allocated; the index is checked as a
whole (vectorized) for alignment, bounds, overlaps and raw sizes. `read_tile` uses `os.pread`, so
any number of threads may read at once without a shared file position.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np
import xxhash

from ..errors import EngineError, PackFormatError, PackNotFoundError, TileCorruptError
from ..remote import RemoteError, RemoteFile, is_remote, open_remote
from . import codec
from .format import (
    HEADER_SIZE,
    INDEX_DTYPE,
    LEVEL_DTYPE,
    PackHeader,
    Supercompression,
    parse_header_bytes,
    position_mix,
)

if TYPE_CHECKING:
    from ..config import RemoteConfig

log = logging.getLogger(__name__)

INDEX_CHUNK = 1 << 16  # index entries read and checked at a time (1.5 MiB)
VERIFY_CHUNK = 4 << 20  # `verify` reads tiles adjacent in the file this many bytes at a time
METADATA_MAX_DEPTH = 64  # nesting of JSON arrays and objects
METADATA_MAX_NUMBER = 64  # characters of one JSON number


def _check_regular(path: Path | None, mode: int) -> None:
    """PackFormatError unless `mode` is a regular file's (the caller adds the path when None)."""
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    if stat.S_ISREG(mode):
        return
    what = next((name for test, name in kinds if test(mode)), "not a regular file")
    where = f"pack {path} " if path is not None else ""
    raise PackFormatError(f"{where}is {what}, not a file")


def _nesting_depth(data: bytes) -> int:
    """Deepest nesting of [ and { outside JSON strings, in one vectorized pass (linear, no recursion)."""
    b = np.frombuffer(data, np.uint8)
    if b.size == 0:
        return 0
    pos = np.arange(b.size, dtype=np.int32)
    backslash = b == ord("\\")
    last_other = np.maximum.accumulate(np.where(backslash, np.int32(-1), pos))  # last non-backslash <= i
    run = np.zeros(b.size, np.int32)  # backslashes right before each byte
    run[1:] = pos[:-1] - last_other[:-1]
    quote = (b == ord('"')) & (run % 2 == 0)  # an unescaped quote opens or closes a string
    inside = (np.cumsum(quote, dtype=np.int32) & 1).astype(bool)
    delta = ((b == ord("[")) | (b == ord("{"))).astype(np.int32) - ((b == ord("]")) | (b == ord("}")))
    delta[inside] = 0
    return int(np.cumsum(delta).max())


def _json_number(text: str) -> float | int:
    if len(text) > METADATA_MAX_NUMBER:
        raise PackFormatError(f"metadata holds a {len(text)}-character number (at most {METADATA_MAX_NUMBER})")
    return float(text) if any(c in text for c in ".eE") else int(text)


def parse_metadata(data: bytes) -> dict:
    """Parse a pack's metadata: a UTF-8 JSON object, nested at most METADATA_MAX_DEPTH deep, numbers
    at most METADATA_MAX_NUMBER characters; PackFormatError (one line) for anything else."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PackFormatError(f"metadata is not valid UTF-8: {exc}") from None
    depth = _nesting_depth(data)  # checked before the (recursive) parser sees it
    if depth > METADATA_MAX_DEPTH:
        raise PackFormatError(f"metadata JSON nests {depth} deep (at most {METADATA_MAX_DEPTH})")
    try:
        meta = json.loads(text, parse_int=_json_number, parse_float=_json_number)
    except (json.JSONDecodeError, ValueError, RecursionError) as exc:
        raise PackFormatError(f"metadata is not valid JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(meta, dict):
        raise PackFormatError(f"metadata must be a JSON object, got {type(meta).__name__}")
    return meta


@dataclass(frozen=True)
class TileEntry:
    """One index entry: where a tile lies and how to check it."""

    offset: int
    stored_size: int
    raw_size: int
    checksum: int


class PackReader:
    """An open pack file. Thread-safe for reads; `close()` is idempotent.

    Only regular files open: a FIFO, a device or a folder is refused before anything is read from
    it (and a FIFO is opened non-blocking, so naming one never hangs). Errors about the file's
    content are PackFormatError naming the file.
    """

    def __init__(self, path: str | os.PathLike[str], remote: RemoteConfig | None = None) -> None:
        self._fd = -1
        self.remote: RemoteFile | None = None  # set when the pack is named by a URL
        if is_remote(path):
            self._open_remote(str(path), remote)
            return
        if isinstance(path, str) and path.startswith("file://"):
            path = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
        self.path: Path | str = Path(path)
        self.name = str(self.path)
        try:
            _check_regular(self.path, os.stat(self.path).st_mode)
        except FileNotFoundError:
            raise PackNotFoundError(f"pack {self.path} does not exist") from None
        except OSError as exc:
            raise PackFormatError(f"cannot open pack {self.path}: {exc.strerror}") from None
        try:  # O_NONBLOCK: should the path have become a FIFO since the stat, open does not wait
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise PackNotFoundError(f"pack {self.path} does not exist") from None
        except IsADirectoryError:
            raise PackFormatError(f"pack {self.path} is a folder, not a file") from None
        except OSError as exc:
            raise PackFormatError(f"cannot open pack {self.path}: {exc.strerror}") from None
        try:
            st = os.fstat(self._fd)
            _check_regular(None, st.st_mode)
            os.set_blocking(self._fd, True)  # no effect on a regular file's reads; tidy for dup()s
            self.file_size = st.st_size
            self._load()
        except OSError as exc:
            self.close()
            raise PackFormatError(f"{self.path}: cannot stat: {exc.strerror}") from None
        except PackFormatError as exc:
            self.close()
            raise PackFormatError(f"{self.path}: {exc}") from None
        except BaseException:
            self.close()
            raise

    def _open_remote(self, url: str, config: RemoteConfig | None) -> None:
        """A pack named by a URL: one request for its version and first bytes, then the rest of the
        header, level table, index and metadata through the remote file's cache."""
        self.path = url
        self.remote = open_remote(url, config)  # RemoteError (one line) when it cannot be reached
        self.name = self.remote.name
        self.file_size = self.remote.size
        try:
            try:
                self._load()
            except PackFormatError as exc:
                # the index and metadata came partly from the disk cache: should those bytes be what
                # is damaged, they are dropped and read once more from the server before the pack
                # counts as corrupt
                if not self.remote.drop_cached():
                    raise
                log.warning("%s: %s; its cached blocks are dropped and read again from the server", self.name, exc)
                self._load()
        except PackFormatError as exc:
            self.close()
            raise PackFormatError(f"{self.name}: {exc}") from None
        except BaseException:
            self.close()
            raise

    def _load(self) -> None:
        raw = parse_header_bytes(self._pread(min(HEADER_SIZE, self.file_size), 0), self.file_size)
        h = self.header = raw.header
        self.version = raw.version
        # Level table: at most MAX_LEVELS entries, and must equal what the header's geometry implies.
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
        self._index = self._load_index(raw.index_checksum, raw.payload_end)
        self.payload_end = raw.payload_end
        self.metadata = self._load_metadata(raw.metadata_offset, raw.metadata_size)

    def _load_index(self, expected_sum: int, payload_end: int) -> np.ndarray:
        """Read the index in bounded chunks, checking each chunk's entries before reading the next,
        so memory grows only with entries that look right; then its checksum, overlaps, and (version
        2) the position binding is undone so `index["checksum"]` is the raw tile's xxh3-64."""
        h = self.header
        count = h.tile_count  # <= MAX_TILES, and parse_header_bytes checked the file holds it all
        index = np.empty(count, INDEX_DTYPE)
        hasher = xxhash.xxh3_64()
        for start in range(0, count, INDEX_CHUNK):
            part = index[start : start + INDEX_CHUNK]
            self._pread_into(memoryview(part).cast("B"), h.index_offset + start * INDEX_DTYPE.itemsize)
            hasher.update(memoryview(part).cast("B"))
            self._check_entries(part, start, payload_end)
        if hasher.intdigest() != expected_sum:
            raise PackFormatError("index checksum mismatch")
        self._check_overlaps(index)
        if self.version >= 2:
            index["checksum"] ^= position_mix(np.arange(count, dtype=np.int64))
        index.flags.writeable = False
        return index

    def _check_entries(self, idx: np.ndarray, start: int, payload_end: int) -> None:
        h = self.header
        off = idx["offset"]
        stored = idx["stored_size"].astype(np.uint64)
        checks = (
            (idx["raw_size"] != h.tile_raw_size, "raw size", idx["raw_size"], f"!= {h.tile_raw_size}"),
            (stored == 0, "stored size", idx["stored_size"], "is zero"),
            (
                stored > h.supercompression.stored_bound(h.tile_raw_size),
                "stored size",
                idx["stored_size"],
                "exceeds the codec bound",
            ),
            (off % np.uint64(h.alignment) != 0, "offset", off, f"is not {h.alignment}-aligned"),
            (off < np.uint64(h.payload_offset), "offset", off, "is before the payload"),
            (
                off > np.uint64(payload_end) - np.minimum(stored, np.uint64(payload_end)),
                "offset",
                off,
                "+ stored size runs past the payload end",
            ),
        )
        for bad, field, values, why in checks:
            hit = np.flatnonzero(bad)
            if hit.size:
                i = int(hit[0])
                raise PackFormatError(
                    f"index entry of tile {self.tile_position(start + i)}: {field} {int(values[i])} {why}"
                )
        if h.supercompression is Supercompression.NONE and np.any(stored != np.uint64(h.tile_raw_size)):
            raise PackFormatError("uncompressed pack has a stored size different from the raw size")

    def _check_overlaps(self, idx: np.ndarray) -> None:
        off = idx["offset"]
        stored = idx["stored_size"].astype(np.uint64)
        order = np.argsort(off, kind="stable")
        ends = off[order] + stored[order]
        overlap = np.flatnonzero(ends[:-1] > off[order][1:])
        if overlap.size:
            a, b = int(order[overlap[0]]), int(order[overlap[0] + 1])
            raise PackFormatError(f"tiles {self.tile_position(a)} and {self.tile_position(b)} overlap in the file")

    def _load_metadata(self, offset: int, size: int) -> dict:
        if size == 0:
            return {}
        return parse_metadata(self._pread(size, offset))

    def _pread(self, size: int, offset: int) -> bytes:
        """`size` bytes at `offset`; callers pass sizes already bounded by the header checks."""
        out = bytearray(size)
        self._pread_into(memoryview(out), offset)
        return bytes(out)

    def _pread_into(self, out: memoryview, offset: int) -> None:
        if self.remote is not None:
            self.remote.read_into(out, offset)  # RemoteError names the URL and the reason
            return
        done = 0
        while done < len(out):  # a read may return fewer bytes than asked (past 2 GiB on Linux)
            try:
                n = os.preadv(self._fd, [out[done:]], offset + done)
            except OSError as exc:
                raise PackFormatError(f"cannot read {len(out)} bytes at {offset}: {exc.strerror}") from None
            if n == 0:
                raise PackFormatError(
                    f"file ended at {offset + done} while reading {len(out)} bytes at {offset} "
                    "(it shrank while being opened?)"
                )
            done += n

    def fileno(self) -> int:
        """The open file descriptor (for readers that pread tiles themselves, e.g. the I/O threads)."""
        if self.remote is not None:
            raise EngineError(f"{self.name} is read over the network: it has no file descriptor")
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
        if self.remote is not None:
            out = bytearray(e.stored_size)
            try:
                self.remote.read_into(memoryview(out), e.offset)
            except RemoteError as exc:
                raise TileCorruptError(f"tile ({level}, {x}, {y}) unreadable: {exc}", level, x, y) from None
            return bytes(out)
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
        if self.header.supercompression is Supercompression.NONE and self.remote is None:
            try:
                n = os.preadv(self._fd, [target], e.offset)
            except OSError as exc:
                raise TileCorruptError(f"tile ({level}, {x}, {y}) unreadable: {exc.strerror}", level, x, y) from None
            if n != e.raw_size:
                raise TileCorruptError(f"tile ({level}, {x}, {y}) truncated: {n} of {e.raw_size} bytes", level, x, y)
            self._check(target, e, level, x, y)
        else:
            self._decode_checked(self.read_stored(level, x, y), e, target, level, x, y)
        return e.raw_size

    def _decode_checked(
        self, stored: bytes | memoryview, e: TileEntry, target: memoryview, level: int, x: int, y: int
    ) -> None:
        try:
            target[:] = codec.decompress(stored, self.header.supercompression, e.raw_size)
        except TileCorruptError as exc:
            self._forget_remote(e)
            raise TileCorruptError(f"tile ({level}, {x}, {y}): {exc}", level, x, y) from None
        self._check(target, e, level, x, y)

    def _check(self, target: memoryview, e: TileEntry, level: int, x: int, y: int) -> None:
        if codec.checksum(target) == e.checksum:
            return
        self._forget_remote(e)
        if self.remote is not None and not self.remote.check_version():
            raise TileCorruptError(
                f"tile ({level}, {x}, {y}): the pack changed on the server since it was opened", level, x, y
            )
        raise TileCorruptError(f"tile ({level}, {x}, {y}) checksum mismatch", level, x, y)

    def _forget_remote(self, e: TileEntry) -> None:
        """A damaged tile of a remote pack: its cached blocks go (the next read fetches them again)."""
        if self.remote is not None:
            self.remote.forget(np.array([e.offset]), np.array([e.stored_size]))

    def verify(self) -> list[tuple[int, int, int, str]]:
        """Read every tile, in file order and in chunks of up to `VERIFY_CHUNK` bytes (one read each:
        over a network, requests of many tiles); return (level, x, y, reason) for each bad one, in
        index order."""
        idx = self._index
        order = np.argsort(idx["offset"], kind="stable")
        offsets = idx["offset"][order].astype(np.int64)
        ends = offsets + idx["stored_size"][order].astype(np.int64)
        buf = memoryview(bytearray(self.header.tile_raw_size))
        bad: list[tuple[int, tuple[int, int, int], str]] = []
        i, n = 0, int(order.size)
        while i < n:
            j = int(np.searchsorted(ends, offsets[i] + VERIFY_CHUNK, side="right"))
            j = max(j, i + 1)
            start = int(offsets[i])
            try:
                chunk = memoryview(self._pread(int(ends[j - 1]) - start, start))
            except (PackFormatError, RemoteError) as exc:
                chunk = None
                why = str(exc)
            for k in range(i, j):
                t = int(order[k])
                lv, x, y = self.tile_position(t)
                if chunk is None:
                    bad.append((t, (lv, x, y), f"tile ({lv}, {x}, {y}) unreadable: {why}"))
                    continue
                e = TileEntry(
                    int(offsets[k]), int(ends[k] - offsets[k]), int(idx["raw_size"][t]), int(idx["checksum"][t])
                )
                try:
                    target = buf[: e.raw_size]
                    stored = chunk[e.offset - start : e.offset - start + e.stored_size]
                    if self.header.supercompression is Supercompression.NONE:
                        target[:] = stored
                        self._check(target, e, lv, x, y)
                    else:
                        self._decode_checked(stored, e, target, lv, x, y)
                except TileCorruptError as exc:
                    bad.append((t, (lv, x, y), str(exc)))
            i = j
        bad.sort(key=lambda b: b[0])
        return [(*pos, why) for _, pos, why in bad]

    # ---- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)
        remote, self.remote = getattr(self, "remote", None), None
        if remote is not None:
            remote.close()

    def __enter__(self) -> PackReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


__all__ = ["PackHeader", "PackReader", "TileEntry", "parse_metadata"]
