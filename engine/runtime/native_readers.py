"""I/O threads with no Python on them: the compiled helper's `ts_pool_*` reading local packs' batches.

A Python I/O thread runs a little Python before and after each compiled read (taking the batch from
the queue, its arguments, the reply), and it runs it whenever it gets the interpreter lock: inside the
render thread's next `update()`, most of the time. Measured on the H200, that Python costs update()
0.1-0.25 ms on ordinary frames and 0.3-0.6 ms on the frames that evict. These threads are POSIX
threads of the helper: the render thread hands a frame's batches over in one call (`submit`) and takes every
finished one in one call a frame (`drain`); between the two nothing of theirs touches the lock.

`IOWorkers` routes a batch here when the helper has the pool, no read hook is set (hooks are Python,
run on Python threads) and the pack is local (remote packs are fetched by `RemoteFile`, in Python).
The contract is `IOWorkers`': every batch submitted comes back once through `drain` (or is dropped
by `shutdown` before its read started); a read that hangs is given up by `overdue` and comes back
later marked abandoned. Arrays named in a job stay referenced here until it comes back; the ring
and the state bytes as long as a thread may write, for ever when `shutdown` leaves one stuck.
"""

from __future__ import annotations

import ctypes
import errno
import logging
from dataclasses import dataclass

import numpy as np

from ..native import Native, PoolFunctions
from .byte_sources import MAX_GAP, RUN_BYTES, ReadBatch, ReadResult

__all__ = ["NativeReaders", "PoolCounts", "PoolShutdown"]

log = logging.getLogger(__name__)

_KEPT_FOR_STUCK_THREADS: list[object] = []  # what threads left inside a read at shutdown may still write


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _fresh_address(a: np.ndarray) -> int:
    """`_address` of a writable C-contiguous array, four times faster (a frame's arrays)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(a))


@dataclass(frozen=True)
class PoolCounts:
    """The pool's threads and queue now."""

    taking: int  # threads that take new batches
    stuck: int  # retired (given up) or closing threads still inside a read
    queued: int  # batches not yet taken by a thread


@dataclass(frozen=True)
class PoolShutdown:
    """What `NativeReaders.shutdown` found."""

    stopped: bool  # no thread is left inside a read
    dropped: int  # queued batches dropped unread
    finished: list[ReadResult]  # batches that came back meanwhile


@dataclass(frozen=True, eq=False)
class _Job:
    """One submitted batch and the arrays its thread reads and writes (kept alive until it is back)."""

    batch: ReadBatch
    arrays: tuple[np.ndarray, ...]  # the submitted batches' arrays, concatenated, as the threads read them
    outcome: np.ndarray  # int32 (2, n): this batch's status and errnum


class NativeReaders:
    """A pool of compiled reader threads (see the module docstring).

    Raises OSError when the threads cannot be started.
    """

    def __init__(
        self, threads: int, ring: np.ndarray, stride: int, state: np.ndarray, skip_state: int, native: Native
    ) -> None:
        fns = native.pool
        if fns is None:
            raise OSError("the compiled helper has no reader pool (an older build)")
        self._fns: PoolFunctions = fns
        self._ring, self._state = ring, state
        handle = fns.create(
            threads,
            _address(ring),
            stride,
            _address(state),
            skip_state,
            MAX_GAP,
            ctypes.byref(native.codecs),
            fns.zstd_create,
            fns.zstd_free,
        )
        if not handle:
            raise OSError(f"could not start {threads} compiled I/O threads")
        self._pool: int | None = handle
        self._threads = threads
        self._native = native  # keeps the codec libraries loaded while the threads call them
        self._jobs: dict[int, _Job] = {}
        self._next_job = 0
        self._ids = np.empty(64, np.int64)
        self._seconds = np.empty(64, np.float64)
        self._abandoned = np.empty(64, np.uint8)
        self._counts = np.zeros(3, np.int64)
        self._kept = False

    @property
    def in_flight(self) -> int:
        """Batches submitted and not yet drained."""
        return len(self._jobs)

    def counts(self) -> PoolCounts:
        """The threads and the queue now (all zero once shut down)."""
        if self._pool is None:
            return PoolCounts(0, 0, 0)
        self._fns.counts(self._pool, _address(self._counts))
        return PoolCounts(*(int(c) for c in self._counts))

    def submit(self, batches: list[ReadBatch]) -> None:
        """Queue `batches` (local packs') in one call: their arrays are concatenated once, and each
        batch's status and errnum come back as views of one outcome array."""
        if self._pool is None:
            raise RuntimeError("io workers are shut down")
        if not batches:
            return
        meta = np.array(
            [(b.source.fd, int(b.source.codec), len(b), b.source.raw_size, max(RUN_BYTES, b.source.max_stored))
             for b in batches],
            np.int64,
        )  # fmt: skip
        arrays = (
            np.concatenate([b.file_offsets for b in batches]).astype(np.int64, copy=False),
            np.concatenate([b.stored for b in batches]).astype(np.int64, copy=False),
            np.concatenate([b.checksums for b in batches]).astype(np.uint64, copy=False),
            np.concatenate([b.ring_slots for b in batches]).astype(np.int64, copy=False),
        )
        total = arrays[0].size
        outcome = np.zeros((2, total), np.int32)
        first = self._next_job
        off, stored, sums, slots = (_address(a) if a.size == 0 else _fresh_address(a) for a in arrays)
        out = _fresh_address(outcome) if total else _address(outcome)
        rc = self._fns.submit_many(
            self._pool, len(batches), first, _fresh_address(meta), off, stored, sums, slots, out, out + 4 * total
        )
        if rc < 0:
            raise RuntimeError("io workers are shut down") if rc == -errno.EPIPE else MemoryError("no memory for reads")
        self._next_job += len(batches)
        at = 0
        for k, b in enumerate(batches):
            n = len(b)
            self._jobs[first + k] = _Job(b, arrays, outcome[:, at : at + n])
            at += n

    def drain(self) -> list[ReadResult]:
        """Finished batches, oldest first."""
        out: list[ReadResult] = []
        if self._pool is None:
            return out
        cap = self._ids.size
        while True:
            k = self._fns.drain(
                self._pool, cap, _address(self._ids), _address(self._seconds), _address(self._abandoned)
            )
            for job, seconds, abandoned in zip(
                self._ids[:k].tolist(), self._seconds[:k].tolist(), self._abandoned[:k].tolist(), strict=True
            ):
                j = self._jobs.pop(job)
                out.append(ReadResult(j.batch, j.outcome[0], j.outcome[1], seconds, bool(abandoned)))
            if k < cap:
                return out

    def wait(self, timeout: float) -> bool:
        """Block (without the GIL) until a batch is finished or `timeout` seconds passed."""
        return self._pool is not None and bool(self._fns.wait(self._pool, max(0.0, timeout)))

    def overdue(self, timeout: float) -> list[ReadBatch]:
        """Give up the batches read for longer than `timeout` seconds (their threads retire and are
        replaced); they come back through `drain` marked abandoned once their reads return."""
        if self._pool is None or not self._jobs:
            return []
        ids = np.empty(len(self._jobs), np.int64)
        k = self._fns.overdue(self._pool, timeout, ids.size, _address(ids))
        taking = self.counts().taking if k else self._threads
        if taking < self._threads:
            log.error(
                "%d of %d compiled I/O threads take new batches: a replacement did not start", taking, self._threads
            )
        return [self._jobs[j].batch for j in ids[:k].tolist()]

    def hold(self, count: int) -> None:
        """Test hook: the next `count` batches taken by a thread wait before their read, as reads that
        hang do (they count as started for `overdue`), until `hold(0)` releases them all."""
        if self._pool is not None:
            self._fns.hold(self._pool, count)

    def shutdown(self, timeout: float) -> PoolShutdown:
        """Stop the threads: queued batches are dropped, reads in progress get `timeout` seconds.
        Callable again while a thread is left inside a read (it asks again)."""
        if self._pool is None:
            return PoolShutdown(True, 0, [])
        dropped = np.empty(len(self._jobs) + 1, np.int64)
        n_dropped = ctypes.c_int64(0)
        live = self._fns.close(self._pool, max(0.0, timeout), dropped.size, _address(dropped), ctypes.byref(n_dropped))
        for job in dropped[: n_dropped.value].tolist():
            del self._jobs[job]
        finished = self.drain()
        if live == 0:  # nothing writes into the ring any more: let its mapping go
            self._fns.release(self._pool)
            self._pool = None
            self._ring = self._state = np.zeros(0, np.uint8)
        elif not self._kept:  # a later shutdown() asks again; if none does, these stay (the ring stays mapped)
            self._kept = True
            _KEPT_FOR_STUCK_THREADS.append((self._ring, self._state, self._jobs, self._native, self._pool))
        return PoolShutdown(live == 0, n_dropped.value, finished)
