"""The on-disk cache of fetched ranges: fixed-size blocks of remote packs, bounded, kept between runs.

Layout of the cache folder (one process at a time: a second finds it locked and runs without a
cache, saying so once):

- ``blocks.dat``: the slab. Slot i's block lives at byte ``i * block_bytes``; blocks are written
  with ``pwrite`` and read with ``preadv``. The file is sparse and grows as blocks arrive, never past
  ``slots * block_bytes``.
- ``index.dat``: a snapshot of the slot table, one `ENTRY` per slot (which pack and block the slot
  holds, its length, its checksum, a use stamp) between a sealed header and a sealed trailer. It is
  written whole to a temporary file, flushed and renamed over the old one, so it is either the old
  snapshot or the new one.
- ``journal.dat``: what changed since that snapshot, one sealed 48-byte `RECORD` per slot filled or
  emptied, appended with ``pwrite``. Replay stops at the first record whose seal does not match (the
  tail a crash tore). On close, and when the journal grows past twice the slot count, it is folded
  into a new snapshot (the journal and the snapshot carry a generation, so a crash between the two
  steps never applies a journal twice).
- ``lock``: held (flock) while a process uses the cache.

No file is memory-mapped: the slot table lives in memory, so a full disk or a failing device shows
up as an `OSError` from a call, never as a signal. Any `OSError` while opening the cache makes it
unavailable (`CacheUnavailable`); any later one turns it off for the rest of the process with one
warning. Remote packs then stream without it.

A pack is named by two hashes: of its URL, and of its URL plus version (size, ETag, Last-Modified).
Blocks are found by the second, so a pack that changed on the server never meets bytes cached from
the version before; opening a new version frees the old one's blocks.

Every block's checksum is its xxh3 seeded with its pack and block number, so bytes torn by a crash,
flipped on disk, or filed under another block by a damaged table are a miss, never wrong bytes. A
block is checked the first time this process reads it; after that, since only this process writes
the slab while it holds the lock, reads copy it without hashing again. Eviction is least recently
used, in chunks of 1/32 of the slots, by the use stamps.

Parsing the files is `parse_cache_files` (bytes in, a `CacheImage` out; any bytes are accepted,
whatever cannot be trusted is dropped), and `read_cache_folder` reads a folder through it. Every
file operation goes through `_File` / `_rename` / `_unlink`, which call the hook installed with
`fault_hook` first: tests make the Nth operation fail (`FailNth`).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import logging
import os
import stat
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from .. import _io

__all__ = [
    "BlockCache",
    "CacheImage",
    "CacheOp",
    "CacheStats",
    "CacheUnavailable",
    "FailNth",
    "fault_hook",
    "parse_cache_files",
    "read_cache_folder",
]

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # version 1 was a memory-mapped index.dat and a cache.json
SNAPSHOT_MAGIC = b"TSCSNAP\0"
JOURNAL_MAGIC = b"TSCJRNL\0"
HEADER = struct.Struct("<8sIIQQ")  # magic, format version, block bytes, slots, generation
HEADER_BYTES = HEADER.size + 8  # + the header's seal
SEAL_BYTES = 8
ENTRY = np.dtype(
    [
        ("pack", "<u8"),  # 0: the slot is empty
        ("url", "<u8"),
        ("block", "<i8"),
        ("stamp", "<u8"),
        ("checksum", "<u8"),
        ("length", "<u4"),
        ("pad", "<u4"),
    ]
)
RECORD = np.dtype(
    [
        ("slot", "<u4"),
        ("length", "<u4"),
        ("pack", "<u8"),  # 0: the slot was emptied
        ("url", "<u8"),
        ("block", "<i8"),
        ("checksum", "<u8"),
        ("seal", "<u8"),  # xxh3 of the fields above, seeded with the generation and the record's place
    ]
)
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


class CacheUnavailable(Exception):
    """The cache folder cannot be used (locked by another process, not writable, a failing disk)."""


@dataclass(frozen=True)
class CacheStats:
    """The cache as a whole (every pack in it)."""

    used_bytes: int
    capacity_bytes: int
    blocks: int


class CacheState(enum.Enum):
    ACTIVE = "active"
    OFF = "off"  # an I/O error: no more reads or writes, the files stay as they are
    CLOSED = "closed"


# ---- file operations (one place for tests to inject failures) ----------------------------------------
class CacheOp(enum.Enum):
    """The cache's file operations, as a fault hook sees them."""

    OPEN = "open"
    PREAD = "pread"
    PWRITE = "pwrite"
    FSYNC = "fsync"
    TRUNCATE = "truncate"
    RENAME = "rename"
    UNLINK = "unlink"


FaultHook = Callable[[CacheOp, str], None]
_hook: FaultHook | None = None


@contextlib.contextmanager
def fault_hook(hook: FaultHook) -> Iterator[FaultHook]:
    """Call ``hook(op, path)`` before each cache file operation while the block runs; an `OSError`
    it raises is that operation's failure."""
    global _hook
    previous, _hook = _hook, hook
    try:
        yield hook
    finally:
        _hook = previous


class FailNth:
    """A fault hook that fails the `n`th operation (from 1) among `ops` (all when None) with `errnum`.

    ``calls`` counts the operations seen, so a first run with ``n=0`` (never fails) measures how many
    there are to sweep over.
    """

    def __init__(self, n: int, errnum: int = errno.ENOSPC, ops: frozenset[CacheOp] | None = None) -> None:
        self.n, self.errnum, self.ops = n, errnum, ops
        self.calls = 0
        self.failed: tuple[CacheOp, str] | None = None
        self._lock = threading.Lock()

    def __call__(self, op: CacheOp, path: str) -> None:
        if self.ops is not None and op not in self.ops:
            return
        with self._lock:
            self.calls += 1
            if self.calls != self.n:
                return
            self.failed = (op, path)
        raise OSError(self.errnum, os.strerror(self.errnum), path)


def _check(op: CacheOp, path: str) -> None:
    hook = _hook
    if hook is not None:
        hook(op, path)


class _File:
    """A file descriptor and its path; every call goes through the fault hook, and through
    `texstream._io` (so `texstream.testing.faults` sweeps the cache like every other writer)."""

    def __init__(self, path: Path, flags: int, mode: int = 0o600) -> None:
        self.path = str(path)
        _check(CacheOp.OPEN, self.path)
        self.fd = _io.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, mode)

    def pread(self, size: int, offset: int) -> bytes:
        _check(CacheOp.PREAD, self.path)
        return _io.pread(self.fd, size, offset)

    def preadv(self, buffers: list[memoryview], offset: int) -> int:
        _check(CacheOp.PREAD, self.path)
        return os.preadv(self.fd, buffers, offset)

    def pwrite(self, data: bytes | memoryview, offset: int) -> None:
        """All of `data` at `offset`; a short write is an OSError (ENOSPC), as the disk is full."""
        _check(CacheOp.PWRITE, self.path)
        if _io.pwrite(self.fd, data, offset) != len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)

    def fsync(self) -> None:
        _check(CacheOp.FSYNC, self.path)
        _io.fsync(self.fd)

    def truncate(self, size: int) -> None:
        _check(CacheOp.TRUNCATE, self.path)
        _io.ftruncate(self.fd, size)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def _rename(src: Path, dst: Path) -> None:
    _check(CacheOp.RENAME, str(dst))
    _io.replace(src, dst)


def _unlink(path: Path) -> None:
    _check(CacheOp.UNLINK, str(path))
    path.unlink(missing_ok=True)


# ---- the files' format ------------------------------------------------------------------------------
def _seal(data: bytes | memoryview, seed: int) -> int:
    return xxhash.xxh3_64_intdigest(data, seed=seed & _MASK64)


def block_seed(pack_id: int, block: int) -> int:
    """The seed of a block's checksum: the same bytes under another pack or block do not match."""
    return (pack_id ^ (block * _GOLDEN)) & _MASK64


def _header(magic: bytes, block_bytes: int, slots: int, generation: int) -> bytes:
    head = HEADER.pack(magic, FORMAT_VERSION, block_bytes, slots, generation)
    return head + struct.pack("<Q", _seal(head, 0))


def _parse_header(data: bytes, magic: bytes, block_bytes: int, slots: int) -> int | None:
    """The generation, or None unless `data` starts with a sealed header of this geometry."""
    if len(data) < HEADER_BYTES:
        return None
    head = data[: HEADER.size]
    (seal,) = struct.unpack_from("<Q", data, HEADER.size)
    if seal != _seal(head, 0):
        return None
    got_magic, version, got_block, got_slots, generation = HEADER.unpack(head)
    if (got_magic, version, got_block, got_slots) != (magic, FORMAT_VERSION, block_bytes, slots):
        return None
    return int(generation)


def snapshot_bytes(block_bytes: int, slots: int) -> int:
    return HEADER_BYTES + slots * ENTRY.itemsize + SEAL_BYTES


def journal_limit(slots: int) -> int:
    """Records at most in a journal before it is folded into a snapshot."""
    return 2 * slots + 64


@dataclass(frozen=True, kw_only=True)
class CacheImage:
    """What a cache folder's files say, once everything that cannot be trusted is dropped.

    entries : one ENTRY per slot (pack 0: empty), no (pack, block) twice, lengths in 1..block_bytes
    generation : of the snapshot the journal applies to (0: no snapshot)
    journal_records : records replayed (appending continues after them)
    journal_ok : the journal's header is right for this generation (else the journal starts over)
    notes : why something was dropped, for the log
    """

    entries: np.ndarray
    generation: int
    journal_records: int
    journal_ok: bool
    notes: tuple[str, ...]


def parse_cache_files(snapshot: bytes | None, journal: bytes | None, *, block_bytes: int, slots: int) -> CacheImage:
    """The slot table that `index.dat` (`snapshot`) and `journal.dat` (`journal`) describe.

    Accepts any bytes (None: the file is missing) and never raises for them: a snapshot that is not
    exactly right is ignored (an empty table), a journal is replayed up to its first bad record.
    Nothing is allocated from sizes the files state: the table has the `slots` the caller gives.
    """
    notes: list[str] = []
    entries = np.zeros(slots, ENTRY)
    generation = 0
    if snapshot is not None:
        gen = _parse_header(snapshot, SNAPSHOT_MAGIC, block_bytes, slots)
        body_end = HEADER_BYTES + slots * ENTRY.itemsize
        if gen is None:
            notes.append("index.dat is not a snapshot of this geometry")
        elif len(snapshot) != snapshot_bytes(block_bytes, slots):
            notes.append(f"index.dat holds {len(snapshot)} bytes, not {snapshot_bytes(block_bytes, slots)}")
        elif struct.unpack_from("<Q", snapshot, body_end)[0] != _seal(memoryview(snapshot)[:body_end], gen):
            notes.append("index.dat's seal does not match")
        else:
            entries = np.frombuffer(snapshot, ENTRY, slots, HEADER_BYTES).copy()
            generation = gen
    bad = (entries["pack"] != 0) & (
        (entries["length"] == 0) | (entries["length"] > block_bytes) | (entries["block"] < 0)
    )
    if bad.any():
        notes.append(f"{int(bad.sum())} snapshot entries out of range")
        entries[bad] = 0
    _drop_duplicates(entries, notes)
    records, journal_ok = 0, False
    if journal is not None:
        gen = _parse_header(journal, JOURNAL_MAGIC, block_bytes, slots)
        if gen is None or gen != generation:
            notes.append("journal.dat does not follow index.dat")
        else:
            journal_ok = True
            records = _replay(journal, entries, generation, block_bytes, notes)
    return CacheImage(
        entries=entries, generation=generation, journal_records=records, journal_ok=journal_ok, notes=tuple(notes)
    )


def _drop_duplicates(entries: np.ndarray, notes: list[str]) -> None:
    """Keep one slot per (pack, block): the most recently used."""
    filled = np.flatnonzero(entries["pack"] != 0)
    if filled.size < 2:
        return
    e = entries[filled]
    order = np.lexsort((e["stamp"], e["block"], e["pack"]))
    same = (e["pack"][order][1:] == e["pack"][order][:-1]) & (e["block"][order][1:] == e["block"][order][:-1])
    dup = filled[order[:-1][same]]
    if dup.size:
        notes.append(f"{dup.size} snapshot entries name a block held by another slot")
        entries[dup] = 0


def _replay(journal: bytes, entries: np.ndarray, generation: int, block_bytes: int, notes: list[str]) -> int:
    slots = entries.size
    count = min((len(journal) - HEADER_BYTES) // RECORD.itemsize, journal_limit(slots))
    recs = np.frombuffer(journal, RECORD, count, HEADER_BYTES)
    raw = memoryview(journal)[HEADER_BYTES:]
    where = {(int(p), int(b)): int(s) for s, p, b in _filled(entries)}
    stamp = int(entries["stamp"].max(initial=0))
    size = RECORD.itemsize
    for i in range(count):
        at = i * size
        if int(recs["seal"][i]) != _seal(raw[at : at + size - SEAL_BYTES], generation * _GOLDEN + i):
            notes.append(f"journal.dat ends at a torn record ({i} of {count})")
            return i
        r = recs[i]
        slot, pack, block, length = int(r["slot"]), int(r["pack"]), int(r["block"]), int(r["length"])
        if slot >= slots or (pack != 0 and not (0 < length <= block_bytes and block >= 0)):
            notes.append(f"journal record {i} is out of range")
            return i
        old = entries[slot]
        where.pop((int(old["pack"]), int(old["block"])), None)
        entries[slot] = 0
        if pack == 0:
            continue
        other = where.pop((pack, block), None)
        if other is not None:
            entries[other] = 0
        stamp += 1
        entries[slot] = (pack, int(r["url"]), block, stamp, int(r["checksum"]), length, 0)
        where[(pack, block)] = slot
    return count


def _filled(entries: np.ndarray) -> Iterator[tuple[int, int, int]]:
    filled = np.flatnonzero(entries["pack"] != 0)
    yield from zip(filled.tolist(), entries["pack"][filled].tolist(), entries["block"][filled].tolist(), strict=True)


def _read_bounded(path: Path, limit: int) -> bytes | None:
    """At most `limit` bytes of a regular file (None: missing or not a regular file)."""
    try:
        f = _File(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(f.fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return f.pread(min(limit, st.st_size), 0)
    finally:
        f.close()


def read_cache_folder(folder: Path, *, block_bytes: int, slots: int) -> CacheImage:
    """`parse_cache_files` of a folder's `index.dat` and `journal.dat` (each read up to its largest
    valid size plus one byte); OSError when a file cannot be read."""
    snap = _read_bounded(folder / "index.dat", snapshot_bytes(block_bytes, slots) + 1)
    journal = _read_bounded(folder / "journal.dat", HEADER_BYTES + journal_limit(slots) * RECORD.itemsize)
    return parse_cache_files(snap, journal, block_bytes=block_bytes, slots=slots)


# ---- the cache ----------------------------------------------------------------------------------------
class BlockCache:
    """Blocks of remote packs on disk, bounded by `capacity_bytes`. Thread-safe.

    Parameters
    ----------
    directory : the cache folder (created private when missing)
    capacity_bytes : the bound of the slab
    block_bytes : the size of a block

    Raises
    ------
    CacheUnavailable
        The folder is locked by another process, or an OSError while opening it.
    """

    def __init__(self, directory: Path, capacity_bytes: int, block_bytes: int) -> None:
        self.directory = directory
        self.block_bytes = block_bytes
        self.slots = max(1, capacity_bytes // block_bytes)
        self._lock = threading.Lock()
        self._off_lock = threading.Lock()
        self._state = CacheState.ACTIVE
        self._lock_file = self._data = self._journal = None
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._lock_file = _File(directory / "lock", os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(self._lock_file.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CacheUnavailable(f"{directory} is in use by another process") from None
            self._open_files()
        except CacheUnavailable:
            self.close()
            raise
        except OSError as exc:
            self.close()
            raise CacheUnavailable(f"{exc.filename or directory}: {exc.strerror or exc}") from None

    def _open_files(self) -> None:
        d = self.directory
        image = read_cache_folder(d, block_bytes=self.block_bytes, slots=self.slots)
        for note in image.notes:
            log.debug("remote cache %s: %s", d, note)
        if (d / "cache.json").exists():  # the memory-mapped layout before this one
            _unlink(d / "cache.json")
        self._entries = image.entries
        self._generation = image.generation
        self._data = _File(d / "blocks.dat", os.O_RDWR | os.O_CREAT)
        filled = self._entries["pack"] != 0
        if not filled.any() and self._data.size():
            self._data.truncate(0)  # nothing in it can be found: give its disk back
        elif self._data.size() > self.slots * self.block_bytes:
            self._data.truncate(self.slots * self.block_bytes)
        self._journal = _File(d / "journal.dat", os.O_RDWR | os.O_CREAT)
        self._journal_records = image.journal_records
        if not image.journal_ok:
            self._journal.truncate(0)
            self._journal.pwrite(self._header(JOURNAL_MAGIC, self._generation), 0)
            self._journal_records = 0
        self._pending: list[tuple[int, int, int, int, int, int]] = []  # journal records not yet written
        self._slot_gen = np.zeros(self.slots, np.uint32)  # bumped when a slot is emptied or refilled
        self._verified = np.zeros(self.slots, bool)  # checked (or written) by this process
        self._writing = np.zeros(self.slots, bool)
        self._maps: dict[int, np.ndarray] = {}  # pack id -> slot of each block (-1: not cached)
        self._free = np.flatnonzero(~filled)[::-1].tolist()  # popped from the end: lowest slot first
        self._free_sorted = True
        self._clock = int(self._entries["stamp"].max(initial=0)) + 1
        self.used_bytes = int(self._entries["length"][filled].sum(dtype=np.int64))
        self._dirty = False
        if self._journal_records > journal_limit(self.slots) // 2:
            self._compact()

    def _header(self, magic: bytes, generation: int) -> bytes:
        return _header(magic, self.block_bytes, self.slots, generation)

    @property
    def active(self) -> bool:
        """False once an I/O error turned the cache off (or after `close`)."""
        return self._state is CacheState.ACTIVE

    def _turn_off(self, exc: OSError, doing: str) -> None:
        """The first I/O error: warn once; from now on every call is a miss or a no-op."""
        with self._off_lock:  # may be called with or without self._lock held
            if self._state is not CacheState.ACTIVE:
                return
            self._state = CacheState.OFF
        log.warning(
            "remote cache %s: %s while %s; remote packs run without a disk cache from now on",
            self.directory,
            exc.strerror or exc,
            doing,
        )

    # ---- packs -------------------------------------------------------------------------------------------
    @staticmethod
    def pack_ids(url: str, version_key: str) -> tuple[int, int]:
        """(pack id, url id): nonzero hashes naming a pack version and its URL."""
        url_id = xxhash.xxh3_64_intdigest(url.encode()) | 1
        pack_id = xxhash.xxh3_64_intdigest(f"{url}\0{version_key}".encode()) | 1
        return pack_id, url_id

    def adopt(self, pack_id: int, url_id: int, block_count: int) -> int:
        """Make the pack's blocks findable, and free the blocks of other versions of the same URL (and
        any past the pack's end); returns how many blocks were freed."""
        with self._lock:
            if pack_id in self._maps:
                return 0
            e = self._entries
            mine = e["pack"] == pack_id
            stale = np.flatnonzero(
                ((e["url"] == url_id) & ~mine & (e["pack"] != 0)) | (mine & (e["block"] >= block_count))
            )
            for slot in stale.tolist():
                self._drop(slot)
            where = np.full(block_count, -1, np.int32)
            held = np.flatnonzero(e["pack"] == pack_id)
            where[e["block"][held]] = held
            self._maps[pack_id] = where
            self._flush_journal()
            return int(stale.size)

    # ---- blocks ------------------------------------------------------------------------------------------
    def read_blocks(self, pack_id: int, blocks: np.ndarray, lengths: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Copy the cached ones of `blocks` into the rows of `out`; which were found.

        Parameters
        ----------
        pack_id : an adopted pack
        blocks : block numbers, ascending, no repeats
        lengths : each block's length (the block size but for the pack's last block)
        out : ``len(blocks) x block_bytes`` uint8, C-contiguous; rows of blocks not found are unspecified

        Returns
        -------
        A bool per block: its bytes are in `out` and match their checksum.
        """
        n = int(blocks.size)
        found = np.zeros(n, bool)
        bb = self.block_bytes
        with self._lock:
            where = self._maps.get(pack_id)
            if n == 0 or where is None or not self.active:
                return found
            inside = (blocks >= 0) & (blocks < where.size)
            slots = np.full(n, -1, np.int64)
            slots[inside] = where[blocks[inside]]
            rows = np.flatnonzero(slots >= 0)
            if not rows.size:
                return found
            slots = slots[rows]
            wrong = self._entries["length"][slots] != lengths[rows]
            for slot in slots[wrong].tolist():
                self._drop(slot)
            rows, slots = rows[~wrong], slots[~wrong]
            gens = self._slot_gen[slots].copy()
            unchecked = ~self._verified[slots]
            sums = self._entries["checksum"][slots]
            self._entries["stamp"][slots] = self._clock + np.arange(slots.size, dtype=np.uint64)
            self._clock += int(slots.size)
            self._dirty = True
            self._flush_journal()
        if not rows.size:  # every cached block had another length: dropped, all misses
            return found
        flat = out.reshape(-1)
        got_rows = np.zeros(rows.size, bool)
        # one read per stretch of blocks that are adjacent both in the pack and in the slab
        cut = np.flatnonzero((np.diff(rows) != 1) | (np.diff(slots) != 1)) + 1
        try:
            for a, b in zip([0, *cut.tolist()], [*cut.tolist(), rows.size], strict=True):
                r0, r1 = int(rows[a]), int(rows[b - 1]) + 1
                got = self._data.preadv([memoryview(flat[r0 * bb : r1 * bb])], int(slots[a]) * bb)
                got_rows[a:b] = (rows[a:b] - r0) * bb + lengths[rows[a:b]] <= got
        except OSError as exc:
            self._turn_off(exc, "reading blocks")
            return found
        bad: list[int] = []
        for k in np.flatnonzero(unchecked & got_rows).tolist():
            r = int(rows[k])
            data = memoryview(flat[r * bb : r * bb + int(lengths[r])])
            if xxhash.xxh3_64_intdigest(data, seed=block_seed(pack_id, int(blocks[r]))) != int(sums[k]):
                got_rows[k] = False
                bad.append(k)
        with self._lock:
            same = self._slot_gen[slots] == gens  # not emptied or refilled while we read
            ok = got_rows & same
            self._verified[slots[ok & unchecked]] = True
            for k in bad:
                if same[k]:
                    self._drop(int(slots[k]))
            self._flush_journal()
        found[rows[ok]] = True
        return found

    def put(self, pack_id: int, url_id: int, first_block: int, data: bytes | memoryview) -> None:
        """Cache `data`, the bytes of blocks `first_block`... (all whole blocks but maybe the last).

        Blocks already cached, past the pack's end or with no slot to spare are skipped.
        """
        bb = self.block_bytes
        view = memoryview(data).cast("B")
        count = -(-len(view) // bb)
        with self._lock:
            where = self._maps.get(pack_id)
            if where is None or not self.active:
                return
            todo: list[tuple[int, int]] = []  # (block, slot)
            for k in range(count):
                b = first_block + k
                if not 0 <= b < where.size or where[b] >= 0:
                    continue
                slot = self._take_slot()
                if slot is None:
                    break  # every slot is being written by other threads: skip caching the rest
                self._writing[slot] = True
                todo.append((b, slot))
        if not todo:
            return
        sums = [
            xxhash.xxh3_64_intdigest(
                view[(b - first_block) * bb : (b - first_block + 1) * bb], seed=block_seed(pack_id, b)
            )
            for b, _ in todo
        ]
        written = 0
        try:
            i = 0
            while i < len(todo):  # one write per stretch adjacent in the pack and in the slab
                j = i + 1
                while j < len(todo) and todo[j][0] == todo[j - 1][0] + 1 and todo[j][1] == todo[j - 1][1] + 1:
                    j += 1
                lo = (todo[i][0] - first_block) * bb
                hi = min(len(view), (todo[j - 1][0] - first_block + 1) * bb)
                self._data.pwrite(view[lo:hi], todo[i][1] * bb)
                written = j
                i = j
        except OSError as exc:
            self._turn_off(exc, "writing a block")
        with self._lock:
            for k, (b, slot) in enumerate(todo):
                self._writing[slot] = False
                if k >= written or not self.active or where[b] >= 0:  # failed, or cached meanwhile
                    self._release(slot)
                    continue
                length = min(bb, len(view) - (b - first_block) * bb)
                self._entries[slot] = (pack_id, url_id, b, self._clock, sums[k], length, 0)
                self._clock += 1
                self._slot_gen[slot] += 1
                self._verified[slot] = True
                where[b] = slot
                self.used_bytes += length
                self._pending.append((slot, length, pack_id, url_id, b, sums[k]))
            self._dirty = True
            self._flush_journal()

    def discard(self, pack_id: int, blocks: np.ndarray) -> None:
        """Forget these blocks (their bytes turned out bad: fetched again next time)."""
        with self._lock:
            where = self._maps.get(pack_id)
            if where is None:
                return
            blocks = np.asarray(blocks, np.int64)
            blocks = blocks[(blocks >= 0) & (blocks < where.size)]
            for slot in where[blocks][where[blocks] >= 0].tolist():
                self._drop(slot)
            self._flush_journal()

    def discard_pack(self, pack_id: int) -> int:
        """Forget every cached block of the pack; how many there were."""
        with self._lock:
            where = self._maps.get(pack_id)
            if where is None:
                return 0
            held = where[where >= 0].tolist()
            for slot in held:
                self._drop(slot)
            self._flush_journal()
            return len(held)

    # ---- slots (under the lock) ----------------------------------------------------------------------
    def _take_slot(self) -> int | None:
        if not self._free:
            self._evict()
        if not self._free_sorted:
            self._free.sort(reverse=True)
            self._free_sorted = True
        return self._free.pop() if self._free else None

    def _evict(self) -> None:
        """Free the least recently used 1/32 of the slots (at least one)."""
        e = self._entries
        stamps = np.where((e["pack"] != 0) & ~self._writing, e["stamp"], np.uint64(np.iinfo(np.uint64).max))
        count = max(1, self.slots // 32)
        oldest = np.argpartition(stamps, count - 1)[:count] if count < self.slots else np.arange(self.slots)
        for slot in oldest.tolist():
            if not self._writing[slot] and e["pack"][slot] != 0:
                self._drop(slot)

    def _drop(self, slot: int) -> None:
        e = self._entries[slot]
        pack, block = int(e["pack"]), int(e["block"])
        where = self._maps.get(pack)
        if where is not None and 0 <= block < where.size and where[block] == slot:
            where[block] = -1
        self.used_bytes -= int(e["length"])
        self._entries[slot] = (0, 0, 0, int(e["stamp"]), 0, 0, 0)
        self._pending.append((slot, 0, 0, 0, 0, 0))
        self._release(slot)

    def _release(self, slot: int) -> None:
        self._slot_gen[slot] += 1
        self._verified[slot] = False
        self._free.append(slot)
        self._free_sorted = False

    def _flush_journal(self) -> None:
        """Append the pending records (one write); fold the journal into a snapshot when it is long."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if not self.active:
            return
        recs = np.zeros(len(pending), RECORD)
        for k, (slot, length, pack, url, block, checksum) in enumerate(pending):
            recs[k] = (slot, length, pack, url, block, checksum, 0)
        raw = recs.view(np.uint8).reshape(len(pending), RECORD.itemsize)
        base = self._journal_records
        for k in range(len(pending)):
            recs["seal"][k] = _seal(
                raw[k, : RECORD.itemsize - SEAL_BYTES].tobytes(), self._generation * _GOLDEN + base + k
            )
        try:
            self._journal.pwrite(recs.tobytes(), HEADER_BYTES + base * RECORD.itemsize)
        except OSError as exc:
            self._turn_off(exc, "writing its journal")
            return
        self._journal_records += len(pending)
        if self._journal_records > journal_limit(self.slots) - 64:
            self._compact()

    def _compact(self) -> None:
        """A new snapshot of the whole table, then an empty journal after it."""
        gen = self._generation + 1
        body = self._header(SNAPSHOT_MAGIC, gen) + self._entries.tobytes()
        snap = body + struct.pack("<Q", _seal(body, gen))
        final = self.directory / "index.dat"
        temp = self.directory / f"index.{os.getpid()}.tmp"
        try:
            f = _File(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                f.pwrite(snap, 0)
                f.fsync()
            finally:
                f.close()
            _rename(temp, final)
            self._generation = gen  # the old journal no longer applies, whatever happens next
            self._journal.truncate(0)
            self._journal.pwrite(self._header(JOURNAL_MAGIC, gen), 0)
            self._journal_records = 0
            self._dirty = False
        except OSError as exc:
            with contextlib.suppress(OSError):
                temp.unlink(missing_ok=True)
            self._turn_off(exc, "writing its index")

    # ---- state -------------------------------------------------------------------------------------------
    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self.used_bytes, self.slots * self.block_bytes, int((self._entries["pack"] != 0).sum()))

    def close(self) -> None:
        """Write the table (use stamps included) as a snapshot, release the files and the lock."""
        with self._lock:
            if self._state is CacheState.ACTIVE and getattr(self, "_dirty", False):
                self._compact()
            self._state = CacheState.CLOSED
            for name in ("_data", "_journal", "_lock_file"):  # closing the lock's descriptor releases the flock
                f = getattr(self, name, None)
                setattr(self, name, None)
                if f is not None:
                    f.close()
