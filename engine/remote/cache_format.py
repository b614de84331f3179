"""The remote cache's files: the slot table's snapshot (`index.dat`) and journal (`journal.dat`).

`parse_cache_files` turns their bytes into a `CacheImage` (any bytes are accepted; whatever cannot be
trusted is dropped) and `read_cache_folder` reads a folder through it with bounded reads; the block
checksums' seeds (`block_seed`) and the sealed headers are defined here too. `cache.BlockCache` owns
the files at run time.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from .cache_io import CacheFile

__all__ = [
    "ENTRY",
    "GOLDEN",
    "HEADER_BYTES",
    "JOURNAL_MAGIC",
    "MASK64",
    "RECORD",
    "SEAL_BYTES",
    "SNAPSHOT_MAGIC",
    "CacheImage",
    "block_seed",
    "header_bytes",
    "journal_limit",
    "parse_cache_files",
    "read_cache_folder",
    "seal",
    "snapshot_bytes",
]

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
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def seal(data: bytes | memoryview, seed: int) -> int:
    return xxhash.xxh3_64_intdigest(data, seed=seed & MASK64)


def block_seed(pack_id: int, block: int) -> int:
    """The seed of a block's checksum: the same bytes under another pack or block do not match."""
    return (pack_id ^ (block * GOLDEN)) & MASK64


def header_bytes(magic: bytes, block_bytes: int, slots: int, generation: int) -> bytes:
    head = HEADER.pack(magic, FORMAT_VERSION, block_bytes, slots, generation)
    return head + struct.pack("<Q", seal(head, 0))


def _parse_header(data: bytes, magic: bytes, block_bytes: int, slots: int) -> int | None:
    """The generation, or None unless `data` starts with a sealed header of this geometry."""
    if len(data) < HEADER_BYTES:
        return None
    head = data[: HEADER.size]
    (stored,) = struct.unpack_from("<Q", data, HEADER.size)
    if stored != seal(head, 0):
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
        elif struct.unpack_from("<Q", snapshot, body_end)[0] != seal(memoryview(snapshot)[:body_end], gen):
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
        if int(recs["seal"][i]) != seal(raw[at : at + size - SEAL_BYTES], generation * GOLDEN + i):
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
        f = CacheFile(path, os.O_RDONLY | os.O_NONBLOCK)
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
