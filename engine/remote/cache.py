"""The on-disk cache of fetched ranges: fixed-size blocks of remote packs in one bounded file.

Layout of the cache folder (one per process at a time; a second process finds it locked and runs
without a cache, saying so once):

- ``blocks.dat``: `slots` x `block_bytes`, sparse; slot i holds one block of some pack;
- ``index.dat``: one `ENTRY` per slot (which pack and block, its length, its xxh3, a use stamp),
  memory-mapped so it persists without a write per block;
- ``cache.json``: the geometry; a cache made with another block size or slot count starts empty;
- ``lock``: held (flock) while a process uses the cache.

A pack is named by two hashes: of its URL, and of its URL plus version (size, ETag, Last-Modified).
Blocks are found by the second, so a pack that changed on the server never meets bytes cached from
the version before; opening a new version frees the old one's blocks.

Crash safety: a slot is marked empty before its data is written and filled in after, and every block
read back is checked against its xxh3, so a torn write is a miss, never wrong bytes. Eviction is
least-recently-used, in chunks of 1/32 of the slots, by the use stamps.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

__all__ = ["BlockCache", "CacheStats", "CacheUnavailable"]

log = logging.getLogger(__name__)

ENTRY = np.dtype(
    [
        ("pack", "<u8"),
        ("url", "<u8"),
        ("block", "<i8"),
        ("stamp", "<u8"),
        ("checksum", "<u8"),
        ("length", "<u4"),
        ("pad", "<u4"),
    ]
)
GEOMETRY_VERSION = 1
MAX_STAMP = 1 << 62  # use stamps count up from 1; one at or past this was not written by the cache


class CacheUnavailable(Exception):
    """The cache folder cannot be used (locked by another process, not writable)."""


@dataclass(frozen=True)
class CacheStats:
    """The cache as a whole (every pack in it)."""

    used_bytes: int
    capacity_bytes: int
    blocks: int


class BlockCache:
    """Blocks of remote packs on disk, bounded by `capacity_bytes`. Thread-safe."""

    def __init__(self, directory: Path, capacity_bytes: int, block_bytes: int) -> None:
        self.directory = directory
        self.block_bytes = block_bytes
        self.slots = max(1, capacity_bytes // block_bytes)
        self._lock = threading.Lock()
        self._lock_fd = self._data_fd = -1
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._lock_fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CacheUnavailable(f"{directory} is in use by another process") from None
            self._open_files()
        except CacheUnavailable:
            self.close()
            raise
        except OSError as exc:
            self.close()
            raise CacheUnavailable(f"{directory}: {exc.strerror or exc}") from None
        # index.dat is read back from disk, so it is outside bytes: an entry the cache cannot have
        # written (a length past the block size, a negative block, a use stamp near the counter's
        # end) is emptied before anything trusts it.
        index = self.index
        impossible = (index["pack"] != 0) & (
            (index["length"] == 0)
            | (index["length"] > self.block_bytes)
            | (index["block"] < 0)
            | (index["stamp"] >= np.uint64(MAX_STAMP))
        )
        index["pack"][impossible] = 0
        index["length"][impossible] = 0
        valid = index["pack"] != 0
        self._where = {
            (int(p), int(b)): int(s)
            for s, p, b in zip(
                np.flatnonzero(valid).tolist(),
                index["pack"][valid].tolist(),
                index["block"][valid].tolist(),
                strict=True,
            )
        }
        self._free = np.flatnonzero(~valid).tolist()
        self._writing: set[int] = set()
        self._clock = int(index["stamp"][valid].max(initial=0)) + 1
        self.used_bytes = int(self.index["length"][valid].sum(dtype=np.int64))

    def _open_files(self) -> None:
        meta_path = self.directory / "cache.json"
        geometry = {"version": GEOMETRY_VERSION, "block_bytes": self.block_bytes, "slots": self.slots}
        try:
            same = json.loads(meta_path.read_text()) == geometry
        except (OSError, ValueError):
            same = False
        index_path, data_path = self.directory / "index.dat", self.directory / "blocks.dat"
        if not same or not index_path.exists() or index_path.stat().st_size != self.slots * ENTRY.itemsize:
            for p in (index_path, data_path):
                p.unlink(missing_ok=True)
            with open(index_path, "wb") as f:
                f.truncate(self.slots * ENTRY.itemsize)  # zeros: every slot empty
            tmp = meta_path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(geometry))
            os.replace(tmp, meta_path)
        self.index = np.memmap(index_path, ENTRY, mode="r+", shape=(self.slots,))
        self._data_fd = os.open(data_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if os.fstat(self._data_fd).st_size != self.slots * self.block_bytes:
            os.ftruncate(self._data_fd, self.slots * self.block_bytes)  # sparse: disk grows as blocks arrive

    # ---- packs -------------------------------------------------------------------------------------------
    @staticmethod
    def pack_ids(url: str, version_key: str) -> tuple[int, int]:
        """(pack id, url id): nonzero hashes naming a pack version and its URL."""
        url_id = xxhash.xxh3_64_intdigest(url.encode()) | 1
        pack_id = xxhash.xxh3_64_intdigest(f"{url}\0{version_key}".encode()) | 1
        return pack_id, url_id

    def adopt(self, pack_id: int, url_id: int) -> int:
        """Free the blocks of other versions of the same URL; returns how many blocks were freed."""
        with self._lock:
            stale = np.flatnonzero(
                (self.index["url"] == url_id) & (self.index["pack"] != pack_id) & (self.index["pack"] != 0)
            )
            for slot in stale.tolist():
                self._drop(slot)
            return int(stale.size)

    # ---- blocks ------------------------------------------------------------------------------------------
    def get(self, pack_id: int, block: int) -> bytes | None:
        """The block's bytes, or None (not cached, or its bytes no longer match their checksum)."""
        with self._lock:
            slot = self._where.get((pack_id, block))
            if slot is None:
                return None
            entry = self.index[slot]
            length, checksum = int(entry["length"]), int(entry["checksum"])
            self.index["stamp"][slot] = self._clock
            self._clock += 1
        try:
            data = os.pread(self._data_fd, length, slot * self.block_bytes)
        except OSError:
            data = b""
        if len(data) == length and xxhash.xxh3_64_intdigest(data) == checksum:
            return data
        with self._lock:  # torn or overwritten meanwhile: forget it
            if self._where.get((pack_id, block)) == slot and int(self.index["checksum"][slot]) == checksum:
                self._drop(slot)
        return None

    def put(self, pack_id: int, url_id: int, block: int, data: bytes | memoryview) -> None:
        length = len(data)
        if not 0 < length <= self.block_bytes:
            raise ValueError(f"block of {length} bytes (block size {self.block_bytes})")
        with self._lock:
            if (pack_id, block) in self._where:
                return
            slot = self._take_slot()
            if slot is None:
                return  # every slot is being written by other threads: skip caching this one
            self._writing.add(slot)
        ok = False
        try:
            ok = os.pwrite(self._data_fd, data, slot * self.block_bytes) == length
        except OSError as exc:
            log.warning("remote cache %s: cannot write (%s); blocks are not cached", self.directory, exc.strerror)
        with self._lock:
            self._writing.discard(slot)
            if not ok or (pack_id, block) in self._where:  # failed, or another thread cached it meanwhile
                self._free.append(slot)
                return
            e = self.index[slot : slot + 1]
            e["url"], e["block"], e["length"] = url_id, block, length
            e["checksum"] = xxhash.xxh3_64_intdigest(data)
            e["stamp"] = self._clock
            e["pack"] = pack_id  # last: the entry is valid from here
            self._clock += 1
            self._where[(pack_id, block)] = slot
            self.used_bytes += length

    def discard(self, pack_id: int, block: int) -> None:
        """Forget one block (its bytes turned out bad: fetched again next time)."""
        with self._lock:
            slot = self._where.get((pack_id, block))
            if slot is not None:
                self._drop(slot)

    def _take_slot(self) -> int | None:
        if not self._free:
            self._evict()
        return self._free.pop() if self._free else None

    def _evict(self) -> None:
        """Free the least recently used 1/32 of the slots (at least one)."""
        stamps = np.where(self.index["pack"] != 0, self.index["stamp"], np.uint64(np.iinfo(np.uint64).max))
        count = max(1, self.slots // 32)
        oldest = np.argpartition(stamps, count - 1)[:count] if count < self.slots else np.arange(self.slots)
        for slot in oldest.tolist():
            if slot not in self._writing and self.index["pack"][slot] != 0:
                self._drop(slot)

    def _drop(self, slot: int) -> None:
        e = self.index[slot]
        self._where.pop((int(e["pack"]), int(e["block"])), None)
        self.used_bytes -= int(e["length"])
        self.index["pack"][slot] = 0
        self.index["length"][slot] = 0
        self._free.append(slot)

    # ---- state -------------------------------------------------------------------------------------------
    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self.used_bytes, self.slots * self.block_bytes, len(self._where))

    def close(self) -> None:
        index = getattr(self, "index", None)
        if index is not None:
            index.flush()
            self.index = None  # type: ignore[assignment]
        for name in ("_data_fd", "_lock_fd"):  # closing the lock's descriptor releases the flock
            fd = getattr(self, name, -1)
            setattr(self, name, -1)
            if fd >= 0:
                os.close(fd)
