"""Where a tile's bytes come from and how they become ring bytes: the I/O threads' work on one batch.

`read_batch` reads one `ReadBatch` (tiles of one pack sorted by file offset) into its ring slots:
tiles that lie close together in the file are fetched with one read (`_fetch_local`: pread on the
pack's descriptor; `_fetch_remote`: range requests through `texstream.remote`), then decoded into
their slots and checked against their xxh3 (`_decode_native`: the whole batch in one call of the
compiled helper without the interpreter lock; `_decode`: one zstd call for all the batch's frames,
copying and hashing under the lock). One `ReadStatus` per tile comes back.

Nothing here holds GL or starts a thread; `io_workers.IOWorkers` runs `read_batch` on its threads.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..native import Native
from ..pack import codec
from ..pack.format import Supercompression
from ..remote import RemoteFile

if TYPE_CHECKING:
    from ..pack.reader import PackReader

__all__ = [
    "MAX_GAP",
    "RUN_BYTES",
    "ReadBatch",
    "ReadResult",
    "ReadStatus",
    "SourceIndex",
    "TileSource",
    "failure_reasons",
    "read_batch",
]

log = logging.getLogger(__name__)

_i64p = ctypes.POINTER(ctypes.c_int64)
MAX_GAP = 64 << 10  # tiles closer than this in the file are read with one pread (the gap too)
RUN_BYTES = 4 << 20  # longest single read


class ReadStatus(enum.IntEnum):
    """Outcome of one tile of a batch (same codes as _native.c)."""

    OK = 0
    SKIPPED = 1  # its load was cancelled before the read started
    IO_ERROR = 2  # pread failed (errno in ReadResult.errnum)
    TRUNCATED = 3  # the file ends inside the tile
    DECODE_ERROR = 4  # the codec rejected the data or it decodes to the wrong size
    CHECKSUM = 5  # decoded, but the xxh3 differs from the index
    CHANGED = 6  # a remote pack is no longer the version opened (never from the compiled helper)

    def describe(self, err: int = 0) -> str:
        if self is ReadStatus.IO_ERROR:
            return f"unreadable: {os.strerror(err) if err else 'I/O error'}"
        return {
            ReadStatus.OK: "ok",
            ReadStatus.SKIPPED: "cancelled",
            ReadStatus.TRUNCATED: "truncated (the file ends inside it)",
            ReadStatus.DECODE_ERROR: "does not decode",
            ReadStatus.CHECKSUM: "checksum mismatch",
            ReadStatus.CHANGED: "the pack changed on the server since it was opened (reopen it)",
        }[self]


@dataclass(frozen=True)
class TileSource:
    """What a thread needs of an open pack: its descriptor (or remote file), codec and tile size."""

    fd: int  # -1 for a remote pack
    codec: Supercompression
    raw_size: int
    max_stored: int
    name: str  # for messages
    remote: RemoteFile | None = None  # a pack read by URL (its own handle, closed by the owner)

    def close(self) -> None:
        """Close the descriptor or the remote handle (the uploader's, once no batch reads it)."""
        if self.remote is not None:
            self.remote.close()
        elif self.fd >= 0:
            os.close(self.fd)


@dataclass(frozen=True, eq=False)
class ReadBatch:
    """Tiles of one source to read into ring slots, sorted by file offset (parallel int64 arrays)."""

    batch_id: int
    source: TileSource
    tiles: np.ndarray  # tile ids (for the reply)
    ring_slots: np.ndarray
    file_offsets: np.ndarray
    stored: np.ndarray
    checksums: np.ndarray  # uint64

    def __len__(self) -> int:
        return int(self.tiles.size)


@dataclass(frozen=True, eq=False)
class ReadResult:
    """A thread's answer to one batch: a `ReadStatus` and an errno per tile."""

    batch: ReadBatch
    status: np.ndarray  # int32 ReadStatus codes
    errnum: np.ndarray  # int32
    seconds: float  # wall time of the read on its thread
    abandoned: bool = False  # given up by `overdue()` earlier: its loads were already failed


class _Scratch:
    """One thread's reusable read buffer and zstd context."""

    def __init__(self, native: Native | None) -> None:
        self.native = native
        self.buffer = np.zeros(0, np.uint8)
        self.dctx = native.create_dctx() if native is not None else None

    def reserve(self, nbytes: int) -> np.ndarray:
        if self.buffer.size < nbytes:
            self.buffer = np.zeros(max(nbytes, RUN_BYTES), np.uint8)
        return self.buffer

    def close(self) -> None:
        if self.native is not None and self.dctx:
            self.native.free_dctx(self.dctx)
            self.dctx = None


def _runs(batch: ReadBatch, skip: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """[i, j) index ranges of tiles read with one pread (skipped tiles break runs)."""
    off, size = batch.file_offsets, batch.stored
    runs = []
    i, n = 0, len(batch)
    while i < n:
        if skip[i]:
            i += 1
            continue
        start, end, j = int(off[i]), int(off[i] + size[i]), i + 1
        while j < n and not skip[j]:
            nxt = int(off[j])
            if nxt < end or nxt - end > MAX_GAP or nxt + int(size[j]) - start > limit:
                break
            end = nxt + int(size[j])
            j += 1
        runs.append((i, j))
        i = j
    return runs


def _read_batch_python(
    batch: ReadBatch, ring: np.ndarray, stride: int, state: np.ndarray, skip_state: int, scratch: _Scratch
) -> tuple[np.ndarray, np.ndarray]:
    src = batch.source
    n = len(batch)
    status = np.full(n, ReadStatus.OK, np.int32)
    errnum = np.zeros(n, np.int32)
    skip = state[batch.ring_slots] == skip_state
    status[skip] = ReadStatus.SKIPPED
    limit = max(RUN_BYTES, src.max_stored)
    runs = _runs(batch, skip, limit)
    total = sum(int(batch.file_offsets[j - 1] + batch.stored[j - 1] - batch.file_offsets[i]) for i, j in runs)
    buf = scratch.reserve(total)
    where = np.zeros(n, np.int64)  # offset of each tile's stored bytes in buf
    if src.remote is not None:
        _fetch_remote(batch, runs, src.remote, buf, where, status, errnum)
    else:
        _fetch_local(batch, runs, src.fd, buf, where, status, errnum)
    if scratch.native is not None:
        _decode_native(batch, buf, where, ring, stride, status, scratch)
    else:
        _decode(batch, buf, where, ring, stride, status)
    if src.remote is not None:
        _recheck_remote(batch, src.remote, status)
    return status, errnum


def _fetch_local(
    batch: ReadBatch,
    runs: list[tuple[int, int]],
    fd: int,
    buf: np.ndarray,
    where: np.ndarray,
    status: np.ndarray,
    errnum: np.ndarray,
) -> None:
    """One preadv per run into `buf`."""
    at = 0
    for i, j in runs:
        start = int(batch.file_offsets[i])
        want = int(batch.file_offsets[j - 1] + batch.stored[j - 1]) - start
        try:
            got = os.preadv(fd, [memoryview(buf[at : at + want])], start)
        except OSError as exc:
            status[i:j] = ReadStatus.IO_ERROR
            errnum[i:j] = exc.errno or errno.EIO
            continue
        rel = batch.file_offsets[i:j] - start
        short = rel + batch.stored[i:j] > got
        status[i:j][short] = ReadStatus.TRUNCATED
        where[i:j] = at + rel
        at += want


def _fetch_remote(
    batch: ReadBatch,
    runs: list[tuple[int, int]],
    remote: RemoteFile,
    buf: np.ndarray,
    where: np.ndarray,
    status: np.ndarray,
    errnum: np.ndarray,
) -> None:
    """Every run of the batch in one `read_runs` call (cache, coalesced requests, several at once)."""
    if not runs:
        return
    first = np.array([i for i, _ in runs], np.int64)
    last = np.array([j - 1 for _, j in runs], np.int64)
    starts = batch.file_offsets[first]
    lengths = batch.file_offsets[last] + batch.stored[last] - starts
    at = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    err = remote.read_runs(starts, lengths, buf, at)
    for (i, j), run_at, start, e in zip(runs, at.tolist(), starts.tolist(), err.tolist(), strict=True):
        where[i:j] = run_at + batch.file_offsets[i:j] - start
        if e == errno.ESTALE:
            status[i:j] = ReadStatus.CHANGED
        elif e:
            status[i:j] = ReadStatus.IO_ERROR
            errnum[i:j] = e


def _recheck_remote(batch: ReadBatch, remote: RemoteFile, status: np.ndarray) -> None:
    """Tiles of a remote pack that arrived damaged: their cached blocks are dropped (the next try
    fetches them again), and the server is asked whether the pack changed (object stores give no
    per-request version check)."""
    bad = np.flatnonzero((status == ReadStatus.CHECKSUM) | (status == ReadStatus.DECODE_ERROR))
    if not bad.size:
        return
    remote.forget(batch.file_offsets[bad], batch.stored[bad])
    if not remote.check_version():
        status[bad] = ReadStatus.CHANGED


def _decode_native(
    batch: ReadBatch,
    buf: np.ndarray,
    where: np.ndarray,
    ring: np.ndarray,
    stride: int,
    status: np.ndarray,
    scratch: _Scratch,
) -> None:
    """`_decode` in one compiled call without the interpreter lock."""
    native = scratch.native
    assert native is not None
    src = batch.source
    where = np.ascontiguousarray(where, np.int64)
    stored = np.ascontiguousarray(batch.stored, np.int64)
    sums = np.ascontiguousarray(batch.checksums, np.uint64)
    slots = np.ascontiguousarray(batch.ring_slots, np.int64)
    native.decode_batch(
        int(src.codec),
        len(batch),
        buf.ctypes.data,
        where.ctypes.data_as(_i64p),
        stored.ctypes.data_as(_i64p),
        src.raw_size,
        sums.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)),
        slots.ctypes.data_as(_i64p),
        ring.ctypes.data,
        stride,
        scratch.dctx,
        ctypes.byref(native.codecs),
        status.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
    )


def _decode(
    batch: ReadBatch, buf: np.ndarray, where: np.ndarray, ring: np.ndarray, stride: int, status: np.ndarray
) -> None:
    """Decode the OK tiles' stored bytes (at `where` in `buf`) into their ring slots and check them."""
    src = batch.source
    raw = src.raw_size
    todo = np.flatnonzero(status == ReadStatus.OK)
    dst = batch.ring_slots * stride
    if src.codec is Supercompression.ZSTD and todo.size:
        frames = [memoryview(buf[where[k] : where[k] + batch.stored[k]]) for k in todo.tolist()]
        decoded = _zstd_many(frames, raw)
        for k, data in zip(todo.tolist(), decoded, strict=True):
            if data is None:
                status[k] = ReadStatus.DECODE_ERROR
            else:
                ring[dst[k] : dst[k] + raw] = np.frombuffer(data, np.uint8)
    else:
        for k in todo.tolist():
            stored = buf[where[k] : where[k] + batch.stored[k]]
            if src.codec is Supercompression.NONE:
                if stored.size != raw:
                    status[k] = ReadStatus.DECODE_ERROR
                    continue
                ring[dst[k] : dst[k] + raw] = stored
                continue
            try:
                data = codec.decompress(memoryview(stored), src.codec, raw)
            except Exception:  # noqa: BLE001 (TileCorruptError or anything the codec raises)
                status[k] = ReadStatus.DECODE_ERROR
                continue
            ring[dst[k] : dst[k] + raw] = np.frombuffer(data, np.uint8)
    for k in np.flatnonzero(status == ReadStatus.OK).tolist():
        if codec.checksum(ring[dst[k] : dst[k] + raw]) != int(batch.checksums[k]):
            status[k] = ReadStatus.CHECKSUM


def _zstd_many(frames: list[memoryview], raw: int) -> list[bytes | memoryview | None]:
    """Decode zstd frames of `raw` bytes each: in one call (one lock release) when they all decode,
    else one by one (None for a frame that does not decode to exactly `raw` bytes)."""
    from ..pack.codec import _zstd_decompressor

    dctx = _zstd_decompressor()
    multi = getattr(dctx, "multi_decompress_to_buffer", None)
    if multi is not None and len(frames) > 1:
        try:
            out = multi(frames, decompressed_sizes=np.full(len(frames), raw, np.uint64).tobytes())
            segments = [out[i] for i in range(len(out))]
            if all(len(s) == raw for s in segments):
                return segments
        except Exception:  # noqa: BLE001 (a bad frame: find it one by one)
            pass
    result: list[bytes | memoryview | None] = []
    for f in frames:
        try:
            result.append(codec.decompress(f, Supercompression.ZSTD, raw))
        except Exception:  # noqa: BLE001
            result.append(None)
    return result


def read_batch(
    batch: ReadBatch, ring: np.ndarray, stride: int, state: np.ndarray, skip_state: int, scratch: _Scratch
) -> tuple[np.ndarray, np.ndarray]:
    """Read one batch into the ring (compiled helper when `scratch` has one); (status, errnum)."""
    native = scratch.native
    if native is None or batch.source.remote is not None:  # remote: fetched by `RemoteFile`, then decoded
        return _read_batch_python(batch, ring, stride, state, skip_state, scratch)
    n = len(batch)
    status = np.zeros(n, np.int32)
    errnum = np.zeros(n, np.int32)
    src = batch.source
    limit = max(RUN_BYTES, src.max_stored)
    buf = scratch.reserve(limit)
    off = np.ascontiguousarray(batch.file_offsets, np.int64)
    stored = np.ascontiguousarray(batch.stored, np.int64)
    sums = np.ascontiguousarray(batch.checksums, np.uint64)
    slots = np.ascontiguousarray(batch.ring_slots, np.int64)
    native.read_batch(
        src.fd,
        int(src.codec),
        n,
        off.ctypes.data_as(_i64p),
        stored.ctypes.data_as(_i64p),
        src.raw_size,
        sums.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)),
        slots.ctypes.data_as(_i64p),
        ring.ctypes.data,
        stride,
        state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)),
        skip_state,
        buf.ctypes.data,
        buf.size,
        MAX_GAP,
        scratch.dctx,
        ctypes.byref(native.codecs),
        status.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
        errnum.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
    )
    return status, errnum


@dataclass
class SourceIndex:
    """One open pack as the uploader reads it: its descriptor and the index arrays of its tiles."""

    tile: TileSource  # its fd is the uploader's own duplicate of the pack's, closed by the uploader
    offsets: np.ndarray
    stored: np.ndarray
    checksums: np.ndarray
    first_tile: int  # tile id of the pack's first index entry
    batches: int = 0  # batches with the I/O threads
    closing: bool = False

    @classmethod
    def of(cls, reader: PackReader, first_tile: int) -> SourceIndex:
        """`reader`'s pack with its own descriptor (or remote handle), so the reader may close
        whenever its owner likes; `first_tile`: the texture's first tile id."""
        idx = reader.index
        stored = idx["stored_size"].astype(np.int64)
        h = reader.header
        largest = int(stored.max(initial=0))
        if reader.remote is not None:
            tile = TileSource(-1, h.supercompression, h.tile_raw_size, largest, reader.name, reader.remote.share())
        else:
            tile = TileSource(os.dup(reader.fileno()), h.supercompression, h.tile_raw_size, largest, reader.name)
        offsets, checksums = idx["offset"].astype(np.int64), np.ascontiguousarray(idx["checksum"], np.uint64)
        return cls(tile, offsets, stored, checksums, first_tile)


def failure_reasons(
    results: list[ReadResult], failed: np.ndarray, coords: Callable[[np.ndarray], tuple[np.ndarray, ...]]
) -> list[str]:
    """One line per failed load of `results` (`failed`: a mask over their tiles in order), naming
    the pack and the tile's (level, x, y) from `coords(tile ids)` (`TileSpace.coords`)."""
    reasons, at = [], 0
    for r in results:
        n = len(r.batch)
        for k in failed[at : at + n].nonzero()[0].tolist():
            _, lv, x, y = (int(v[0]) for v in coords(r.batch.tiles[k : k + 1]))
            why = ReadStatus(int(r.status[k])).describe(int(r.errnum[k]))
            reasons.append(f"{r.batch.source.name}: tile ({lv}, {x}, {y}) {why}")
        at += n
    return reasons
