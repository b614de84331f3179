"""I/O threads: read batches of tiles (pread, decompress, checksum) straight into staging-ring slots.

The uploader hands over one `ReadBatch` per queue item: tiles of one pack sorted by file offset, each
with the ring slot to fill. A thread reads tiles that lie close together in the file with one pread,
decodes each into its slot, checks its xxh3, and answers with ONE `ReadResult` (a status per tile).

The interpreter lock decides how fast this goes: a thread that must take the lock back after every
blocking call waits for the render thread's switch interval (5 ms) each time the render thread is
busy in Python. So a batch costs as few lock round trips as possible: with the compiled helper
(`texstream.native`) the whole batch runs in one ctypes call without the lock; the pure-Python path
does one pread per run and one zstd call for all the batch's frames (`multi_decompress_to_buffer`),
copying and hashing under the lock (about a microsecond a tile).

Threads touch no GL and no engine state: they read the batch, write into the ring memory of the slots
named in it, and read (never write) the uploader's load-state bytes to skip cancelled loads.
Unexpected exceptions are kept and re-raised on the render thread by `drain` as one `EngineError`:
once per source while its batches keep failing (the rest are counted in `unexpected_errors`, their
tiles fail as unreadable), and again only after one of its batches read cleanly.

A read that hangs (a dead network disk, a stalled device) cannot be interrupted from Python. The
render thread asks `overdue()` each frame: a batch read for longer than the timeout is given up (its
thread is retired and a replacement started, so the other batches keep moving) and the caller fails
its loads. The retired thread exits when its read returns; its result comes back through `drain`
marked `abandoned`, so the caller knows the ring slots are free again. `shutdown` waits a bounded time.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import EngineError
from ..native import Native
from ..pack import codec
from ..pack.format import Supercompression
from ..remote import RemoteFile

__all__ = ["IOWorkers", "ReadBatch", "ReadResult", "ReadStatus", "TileSource", "read_batch"]

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


ReadHook = Callable[[ReadBatch], None]


class _Reader:
    """One I/O thread and what the render thread may ask of it (the batch it reads, since when)."""

    def __init__(self, workers: IOWorkers, index: int) -> None:
        self.batch: ReadBatch | None = None  # written by the thread only
        self.started = 0.0  # time.monotonic() of the batch's start
        self.retired = False  # set by the render thread: exit after the current batch
        self.thread = threading.Thread(target=workers._run, args=(self,), name=f"texstream-io-{index}", daemon=True)


class IOWorkers:
    """A pool of reader threads with one job queue and one completion queue.

    Parameters
    ----------
    threads
        How many threads read at once.
    ring
        The staging ring's memory (uint8, one row of `stride` bytes per slot) the threads write.
    stride
        Bytes between ring slots.
    state
        The uploader's per-slot load-state bytes; a tile whose byte equals `skip_state` when
        its read would start is skipped.
    skip_state
        The cancelled state's value.
    native
        The compiled helper, or None for the pure-Python loop.
    read_hook
        Called on the I/O thread before each batch is read (fault injection in tests:
        it may sleep, block or raise).
    """

    def __init__(
        self,
        threads: int,
        ring: np.ndarray,
        stride: int,
        state: np.ndarray,
        skip_state: int,
        native: Native | None,
        read_hook: ReadHook | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError(f"io thread count must be >= 1, got {threads!r}")
        self._ring, self._stride, self._state, self._skip = ring, stride, state, skip_state
        self.native = native
        self._hook = read_hook
        self._jobs: queue.SimpleQueue[ReadBatch | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[ReadResult] = queue.SimpleQueue()
        self._fatal: BaseException | None = None
        self._failing: set[TileSource] = set()  # sources whose latest batch raised (reported once already)
        self.unexpected_errors = 0  # batches failed by an unexpected exception, the reported ones included
        self._lock = threading.Lock()
        self.pending = 0  # batches submitted and not yet drained (render thread's count)
        self._closed = False
        self._size = threads
        self._readers: list[_Reader] = []  # live threads, retired ones included until they exit
        self._abandoned: set[int] = set()  # batch ids given up by overdue()
        self._named = 0
        for _ in range(threads):
            self._start_reader()

    def _start_reader(self) -> None:
        reader = _Reader(self, self._named)
        self._named += 1
        self._readers.append(reader)
        reader.thread.start()

    @property
    def thread_count(self) -> int:
        """Threads that take new batches (retired ones stuck in a read are not counted)."""
        return sum(1 for r in self._readers if not r.retired)

    @property
    def stuck_count(self) -> int:
        """Retired threads still inside a read that was given up."""
        return sum(1 for r in self._readers if r.retired and r.thread.is_alive())

    def submit(self, batch: ReadBatch) -> None:
        if self._closed:
            raise RuntimeError("io workers are shut down")
        self.pending += 1
        self._jobs.put(batch)

    def _run(self, me: _Reader) -> None:
        scratch = _Scratch(self.native)
        try:
            while not me.retired:
                batch = self._jobs.get()
                if batch is None:
                    return
                me.started = time.monotonic()
                me.batch = batch
                t0 = time.perf_counter()
                try:
                    if np.all(self._state[batch.ring_slots] == self._skip):  # every load cancelled: no read
                        status = np.full(len(batch), ReadStatus.SKIPPED, np.int32)
                        errnum = np.zeros(len(batch), np.int32)
                    else:
                        if self._hook is not None:
                            self._hook(batch)
                        status, errnum = read_batch(batch, self._ring, self._stride, self._state, self._skip, scratch)
                        if self._failing:  # a read without an exception ends its source's failing episode
                            with self._lock:
                                self._failing.discard(batch.source)
                except BaseException as exc:  # unexpected: the batch fails, the error surfaces in drain()
                    status = np.full(len(batch), ReadStatus.IO_ERROR, np.int32)
                    code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
                    errnum = np.full(len(batch), code, np.int32)
                    with self._lock:  # once per source until one of its batches reads cleanly again
                        self.unexpected_errors += 1
                        if batch.source not in self._failing:
                            self._failing.add(batch.source)
                            if self._fatal is None:
                                self._fatal = exc
                with self._lock:  # one decision with overdue(): given up or not
                    abandoned = batch.batch_id in self._abandoned
                    self._abandoned.discard(batch.batch_id)
                    me.batch = None
                self._done.put(ReadResult(batch, status, errnum, time.perf_counter() - t0, abandoned))
        finally:
            scratch.close()

    def overdue(self, timeout: float) -> list[ReadBatch]:
        """Give up batches read for longer than `timeout` seconds (render thread, once a frame): their
        threads are retired (they exit once the read returns) and replaced. The caller fails their
        loads now; their results still come back through `drain`, marked abandoned."""
        now = time.monotonic()
        late: list[ReadBatch] = []
        with self._lock:
            for r in self._readers:
                batch = r.batch
                if batch is None or r.retired or now - r.started < timeout:
                    continue
                if batch.batch_id in self._abandoned:
                    continue
                self._abandoned.add(batch.batch_id)
                r.retired = True
                late.append(batch)
        if any(r.retired for r in self._readers):  # forget retired threads whose read came back
            self._readers = [r for r in self._readers if r.thread.is_alive() or not r.retired]
        if late and not self._closed:
            log.error(
                "%d tile reads hang for over %.1f s (%s); giving them up and starting new I/O threads",
                len(late),
                timeout,
                late[0].source.name,
            )
            for _ in late:
                self._start_reader()
        return late

    def drain(self) -> list[ReadResult]:
        """Finished batches, oldest first. A thread's unexpected exception is raised first (as one
        EngineError), and the finished batches stay queued for the next call (none is lost)."""
        with self._lock:
            fatal, self._fatal = self._fatal, None
        if fatal is not None:
            raise EngineError(f"an I/O thread failed: {type(fatal).__name__}: {fatal}") from fatal
        out: list[ReadResult] = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        self.pending -= len(out)
        return out

    def wait(self, timeout: float) -> ReadResult | None:
        """Block for the next finished batch (the blocking load path only)."""
        try:
            result = self._done.get(timeout=timeout)
        except queue.Empty:
            return None
        self.pending -= 1
        return result

    def shutdown(self, timeout: float = 2.0) -> bool:
        """Stop the threads (idempotent): batches not started are dropped, a read in progress may finish
        within `timeout` seconds. Returns False when a thread is still inside a read then (it keeps
        running as a daemon thread; its batch's ring memory must stay mapped)."""
        if not self._closed:
            self._closed = True
            while True:
                try:
                    if self._jobs.get_nowait() is not None:
                        self.pending -= 1
                except queue.Empty:
                    break
            for r in self._readers:
                r.retired = True
            for _ in self._readers:
                self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for r in self._readers:
            r.thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [r.thread.name for r in self._readers if r.thread.is_alive()]
        if not stuck:  # nothing writes into the ring any more: let its mapping go
            self._ring = np.zeros(0, np.uint8)
            self._state = np.zeros(0, np.uint8)
        else:
            log.error("I/O threads %s are still inside a read after %.1f s", ", ".join(stuck), timeout)
        return not stuck
