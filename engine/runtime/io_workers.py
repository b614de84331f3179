"""I/O threads: read batches of tiles (pread, decompress, checksum) straight into staging-ring slots.

The thread pool lives here; what one thread does with one batch (where the bytes come from, how they
are decoded and checked) is `byte_sources.read_batch`.

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

With the compiled helper, batches of local packs go to `native_readers.NativeReaders`: POSIX threads
that run no Python at all (the render thread submits and drains them in one call each). Python
threads read the rest, started on the first such batch: remote packs, every batch when a read hook
is set or the helper is missing.

A read that hangs (a dead network disk, a stalled device) cannot be interrupted from Python. The
render thread asks `overdue()` each frame: a batch read for longer than the timeout is given up (its
thread is retired and a replacement started, so the other batches keep moving) and the caller fails
its loads. The retired thread exits when its read returns; its result comes back through `drain`
marked `abandoned`, so the caller knows the ring slots are free again. `shutdown` waits a bounded time.
"""

from __future__ import annotations

import errno
import logging
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from ..errors import EngineError
from ..native import Native
from .byte_sources import MAX_GAP, RUN_BYTES, ReadBatch, ReadResult, ReadStatus, TileSource, _Scratch, read_batch
from .native_readers import NativeReaders

__all__ = [
    "MAX_GAP",
    "RUN_BYTES",
    "IOWorkers",
    "ReadBatch",
    "ReadHook",
    "ReadResult",
    "ReadStatus",
    "TileSource",
    "read_batch",
]

log = logging.getLogger(__name__)

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
        self._ready: list[ReadResult] = []  # finished batches taken off a queue but not yet returned
        self.compiled: NativeReaders | None = None
        if native is not None and native.pool is not None and read_hook is None:
            try:
                self.compiled = NativeReaders(threads, ring, stride, state, skip_state, native)
            except OSError as exc:
                log.warning("%s: the I/O threads run Python", exc)
        if self.compiled is None:
            self._start_python_threads()

    def _start_python_threads(self) -> None:
        for _ in range(self._size):
            self._start_reader()

    def _start_reader(self) -> None:
        reader = _Reader(self, self._named)
        self._named += 1
        self._readers.append(reader)
        reader.thread.start()

    @property
    def thread_count(self) -> int:
        """Threads that take new batches (retired ones stuck in a read are not counted)."""
        compiled = self.compiled.counts().taking if self.compiled is not None else 0
        return compiled + sum(1 for r in self._readers if not r.retired)

    @property
    def stuck_count(self) -> int:
        """Retired threads still inside a read that was given up."""
        compiled = self.compiled.counts().stuck if self.compiled is not None else 0
        return compiled + sum(1 for r in self._readers if r.retired and r.thread.is_alive())

    def submit(self, batch: ReadBatch) -> None:
        self.submit_many([batch])

    def submit_many(self, batches: list[ReadBatch]) -> None:
        """Queue `batches` (the compiled threads' share in one call)."""
        if self._closed:
            raise RuntimeError("io workers are shut down")
        python = batches
        if self.compiled is not None:
            python = [b for b in batches if b.source.remote is not None]
            self.compiled.submit([b for b in batches if b.source.remote is None] if python else batches)
        if python and not self._readers:
            self._start_python_threads()
        for batch in python:
            self._jobs.put(batch)
        self.pending += len(batches)

    def hold_compiled_reads(self, count: int) -> None:
        """Test hook: the next `count` batches a compiled thread takes wait before their read, as reads
        that hang do, until `hold_compiled_reads(0)` releases them (Python threads have the read hook)."""
        if self.compiled is None:
            raise RuntimeError("no compiled I/O threads (the helper is missing or a read hook is set)")
        self.compiled.hold(count)

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
        late = self.compiled.overdue(timeout) if self.compiled is not None else []
        if self._readers:
            late += self._overdue_python(timeout)
        if late and not self._closed:
            log.error(
                "%d tile reads hang for over %.1f s (%s); giving them up and starting new I/O threads",
                len(late),
                timeout,
                late[0].source.name,
            )
        return late

    def _overdue_python(self, timeout: float) -> list[ReadBatch]:
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
        if not self._closed:
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
        out, self._ready = self._ready, []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        if self.compiled is not None:
            out += self.compiled.drain()
        self.pending -= len(out)
        return out

    def wait(self, timeout: float) -> ReadResult | None:
        """Block for the next finished batch (the blocking load path only)."""
        deadline = time.monotonic() + timeout
        while not self._ready:
            if self.compiled is not None:
                self._ready += self.compiled.drain()
            try:  # Python threads' results; only those when no compiled batch is in flight
                python_only = self.compiled is None or self.compiled.in_flight == 0
                step = max(0.0, deadline - time.monotonic()) if python_only else 0.0
                self._ready.append(self._done.get(timeout=step) if step else self._done.get_nowait())
            except queue.Empty:
                pass
            if self._ready or time.monotonic() >= deadline:
                break
            if self.compiled is not None and self.compiled.in_flight:  # the compiled threads' next result,
                slice_s = 0.001 if self._readers else timeout  # in 1 ms slices while Python threads read too
                self.compiled.wait(min(slice_s, max(0.0, deadline - time.monotonic())))
        if not self._ready:
            return None
        self.pending -= 1
        return self._ready.pop(0)

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
        compiled_stopped = True
        if self.compiled is not None:
            done = self.compiled.shutdown(timeout)
            compiled_stopped = done.stopped
            self.pending -= done.dropped
            self._ready += done.finished
        for r in self._readers:
            r.thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [r.thread.name for r in self._readers if r.thread.is_alive()]
        if not compiled_stopped:
            stuck.append("(compiled)")
        if not stuck:  # nothing writes into the ring any more: let its mapping go
            self._ring = np.zeros(0, np.uint8)
            self._state = np.zeros(0, np.uint8)
        else:
            log.error("I/O threads %s are still inside a read after %.1f s", ", ".join(stuck), timeout)
        return not stuck
