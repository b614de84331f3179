"""I/O worker threads: pread + checksum + decompress one tile straight into its staging-ring slot.

Workers never touch GL. The render thread hands each job a slot it acquired from the ring; the
worker fills the slot's mapped memory through `PackReader.read_tile_into` (one preadv for
uncompressed packs, decode + one copy otherwise) and reports back through a queue the render
thread drains in `Streamer.update()`. Expected failures (a corrupt, truncated or unreadable tile)
come back as a failed result; anything unexpected is kept and re-raised on the render thread.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from ..errors import TileCorruptError
from ..pack.reader import PackReader

log = logging.getLogger(__name__)


class JobState(enum.Enum):
    QUEUED = "queued"
    READING = "reading"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(eq=False)
class IOJob:
    """One tile to load into one ring slot."""

    tex_id: int
    level: int
    x: int
    y: int
    reader: PackReader
    slot: object  # the staging slot; its `view` is the writable mapped memory
    view: memoryview
    submitted: float = field(default_factory=time.perf_counter)
    state: JobState = JobState.QUEUED
    error: str = ""
    seconds: float = 0.0
    future: Future | None = None


class IOWorkers:
    """A fixed pool of reader threads with a completion queue."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"io thread count must be >= 1, got {threads!r}")
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="texstream-io")
        self._done: queue.SimpleQueue[IOJob] = queue.SimpleQueue()
        self._fatal: BaseException | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.pending = 0

    def submit(self, job: IOJob) -> None:
        if self._closed:
            raise RuntimeError("io workers are shut down")
        self.pending += 1
        job.future = self._pool.submit(self._run, job)

    def _run(self, job: IOJob) -> None:
        if job.state is JobState.CANCELLED:
            self._done.put(job)
            return
        job.state = JobState.READING
        t0 = time.perf_counter()
        try:
            job.reader.read_tile_into(job.level, job.x, job.y, job.view)
            job.state = JobState.DONE
        except TileCorruptError as exc:
            job.state, job.error = JobState.FAILED, str(exc)
        except BaseException as exc:  # unexpected: surfaced on the render thread
            job.state, job.error = JobState.FAILED, f"{type(exc).__name__}: {exc}"
            with self._lock:
                if self._fatal is None:
                    self._fatal = exc
        job.seconds = time.perf_counter() - t0
        self._done.put(job)

    def cancel(self, job: IOJob) -> bool:
        """Cancel a job that has not started; True if it will not run (it still comes back, CANCELLED)."""
        if job.future is not None and job.future.cancel():
            job.state = JobState.CANCELLED
            self._done.put(job)
            return True
        return False

    def drain(self, limit: int | None = None) -> list[IOJob]:
        """Finished jobs (done, failed or cancelled); re-raises a worker's unexpected exception."""
        with self._lock:
            fatal, self._fatal = self._fatal, None
        if fatal is not None:
            raise fatal
        out: list[IOJob] = []
        while limit is None or len(out) < limit:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        self.pending -= len(out)
        return out

    def shutdown(self, wait: bool = True, on_job: Callable[[IOJob], None] | None = None) -> None:
        """Stop the threads (idempotent); queued jobs are cancelled."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=wait, cancel_futures=True)
        if on_job is not None:
            for job in self.drain():
                on_job(job)
