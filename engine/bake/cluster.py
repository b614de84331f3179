"""Bakes on a Dask distributed cluster: another executor of the same bands (`BakeConfig.cluster`).

The bake itself does not change: the main process plans the stages, hands out bands in the same
order, takes the results in submission order and writes them through the same `PackWriter`, so the
pack equals a local bake's tile for tile (and byte for byte when the local bake ran as many jobs as
the cluster has worker threads: the number of jobs sets the band plan and the order of the writes).
Only the pool differs: `ClusterPool` submits each band to the scheduler instead of a local worker.

What travels. Band inputs the main process holds (later stages' float32 rows, in-memory sources,
files read top to bottom) travel inside the task, pickled: the scheduler keeps every task's inputs
until it finishes, so a task whose worker was lost is rerun elsewhere. (Data scattered to a worker
beforehand would die with that worker, and the task with it.) Procedural sources travel as their
few parameters. Files libvips reads region by region (TIFF, .v) travel as a `WorkerFileSource`:
each worker opens the file once and reads its bands' rows itself, so they must sit on storage
every worker can read. PNG, JPEG and the other formats libvips decodes top to bottom are read by
the main process and shipped: opened for random access, libvips decodes the whole file before the
first row (0.28 s and 200 MB for an 8192² RGB PNG, measured), once per worker, where the main
process decodes it once in strips (0.23 s). URL sources are not supported yet.

Failures. Tasks are pure (a band's result depends on its job alone) and may run twice; a lost
worker's tasks are rerun by the scheduler on the others (up to its ``allowed-failures``, then
`KilledWorker`); a task that raised is retried `RETRIES` times (shared storage can fail for a
moment). A scheduler that goes away, or a cluster left without workers for `NO_WORKERS_S`, fails
the bake with one line; the caller then removes its temporary pack. Waiting for a result wakes
every `workers.POLL_S` to look for a deferred Ctrl-C or SIGTERM.

dask[distributed] is an optional dependency (the ``cluster`` extra); this module imports it.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import threading
import time
import uuid
import warnings
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from ..errors import EngineError, SourceError, first_line
from .bands import run_job_in_this_process
from .jobs import BandJob, CutJob, JobResult, Settings
from .source import Source, VipsSource
from .workers import POLL_S, Task, _group_signals_blocked, check_interrupt, worker_start_environment

try:
    import dask
    from distributed import Client, Future, KilledWorker, LocalCluster
except ImportError as exc:  # the optional dependency is missing: say how to get it, in one line
    raise EngineError(f"--cluster needs dask[distributed] ({exc}): pip install 'texstream[cluster]'") from None

log = logging.getLogger(__name__)

CONNECT_S = 10.0  # how long reaching a scheduler (or starting a local cluster) may take
HEALTH_S = 2.0  # how often a waiting bake asks the scheduler how many workers it has
NO_WORKERS_S = 20.0  # a cluster without any worker this long fails the bake
LOST_S = 10.0  # a client that lost its scheduler this long fails the bake
CLOSE_S = 10.0  # how long closing the client and a local cluster may take
RETRIES = 2  # reruns of a band task that raised (a worker lost is rerun by the scheduler regardless)


class ClusterKind(enum.Enum):
    LOCAL = "local"  # a LocalCluster started for this bake, closed after it
    REMOTE = "remote"  # an existing scheduler; only our client is closed after the bake


# ---- connection -----------------------------------------------------------------------------------
class ClusterConnection:
    """A client of a Dask scheduler (and the local cluster behind it, for ``local:N``).

    Opened and closed by `pipeline.bake`; `close` is idempotent and bounded in time.
    """

    def __init__(
        self, spec: str, kind: ClusterKind, client: Client, local: LocalCluster | None, dask_logs: _DaskLogs
    ) -> None:
        self.spec = spec
        self.dask_logs = dask_logs  # Dask's loggers, quieter during the bake
        self.kind = kind
        self.client = client
        self.local = local
        self._no_workers_since: float | None = None
        self._lost_since: float | None = None
        self._next_check = 0.0

    @classmethod
    def open(cls, spec: str) -> ClusterConnection:
        """Start ``local:N`` or connect to a scheduler's address; one-line `EngineError` if neither works."""
        logs = _DaskLogs()
        logs.quiet(logging.WARNING)
        try:
            if spec.startswith("local:"):
                return cls._start_local(int(spec.split(":", 1)[1]), spec, logs)
            try:
                client = Client(spec, timeout=CONNECT_S, set_as_default=False)
            except Exception as exc:  # noqa: BLE001 - refused, timed out, or a reply that is not Dask's
                raise EngineError(f"cannot reach the Dask scheduler at {spec}: {first_line(exc)}") from None
        except BaseException:
            logs.restore()
            raise
        connection = cls(spec, ClusterKind.REMOTE, client, None, logs)
        try:
            connection._wait_for_a_worker()
        except BaseException:
            connection.close()
            raise
        return connection

    @classmethod
    def _start_local(cls, workers: int, spec: str, logs: _DaskLogs) -> ClusterConnection:
        # Ctrl-C reaches the whole process group: the worker processes (and the event-loop thread
        # that restarts them) start with it blocked, so that only this process hears it and stops
        # them in order (see workers._group_signals_blocked). multiprocessing's resource tracker
        # starts first: its start unblocks those signals in the thread that starts it, which would
        # be Dask's event-loop thread, the one that starts (and restarts) the worker processes.
        from multiprocessing import resource_tracker

        with worker_start_environment():  # it is a `python -c` process too
            resource_tracker.ensure_running()
        try:
            with worker_start_environment(), _group_signals_blocked(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "port 8787 is in use" and the like: not the bake's business
                local = LocalCluster(
                    n_workers=workers,
                    threads_per_worker=1,  # a band keeps a core busy (the encoder releases the GIL briefly)
                    processes=True,
                    host="127.0.0.1",
                    dashboard_address=None,
                    silence_logs=logging.ERROR,
                )
                client = Client(local, timeout=CONNECT_S, set_as_default=False)
        except Exception as exc:  # noqa: BLE001 - out of ports, processes, memory
            raise EngineError(f"cannot start a local Dask cluster ({spec}): {first_line(exc)}") from None
        return cls(spec, ClusterKind.LOCAL, client, local, logs)

    def _wait_for_a_worker(self) -> None:
        try:
            self.client.wait_for_workers(1, timeout=CONNECT_S)
        except Exception:  # noqa: BLE001 - distributed raises TimeoutError (or OSError when the scheduler left)
            raise EngineError(f"the Dask scheduler at {self.spec} has no workers (waited {CONNECT_S:.0f} s)") from None

    @property
    def threads(self) -> int:
        """Worker threads of the cluster now: the bake's number of jobs."""
        return int(self.client.scheduler_info(n_workers=0).get("total_threads", 0))

    def check(self) -> None:
        """Raise `EngineError` when the scheduler is gone or no worker is left (both for a while);
        asks the scheduler at most every `HEALTH_S`."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + HEALTH_S
        status = self.client.status
        if status in ("closing", "closed", "failed"):
            raise self.lost()
        if status != "running":  # reconnecting
            self._lost_since = self._lost_since or now
            if now - self._lost_since > LOST_S:
                raise self.lost()
            return
        self._lost_since = None
        try:
            workers = int(self.client.scheduler_info(n_workers=0).get("n_workers", 0))
        except OSError:
            return  # the status turns as the client notices; judged then
        if workers:
            self._no_workers_since = None
        else:
            self._no_workers_since = self._no_workers_since or now
            if now - self._no_workers_since > NO_WORKERS_S:
                raise EngineError(f"the Dask cluster at {self.spec} has had no workers for {NO_WORKERS_S:.0f} s")

    def lost(self) -> EngineError:
        return EngineError(f"lost the Dask scheduler at {self.spec}")

    def close(self) -> None:
        """Close the client, and the local cluster if it is ours (its worker processes end with it)."""
        client, local = self.client, self.local
        self.client, self.local = None, None  # type: ignore[assignment]
        if client is not None:
            if client.status != "running":  # reconnecting: closing it cancels that, which Dask logs as an error
                self.dask_logs.quiet(logging.CRITICAL)
            try:
                client.close(timeout=CLOSE_S)
            except Exception as exc:  # noqa: BLE001 - a scheduler already gone: nothing to close
                log.debug("closing the Dask client: %s", exc)
        if local is not None:
            # Our own workers: a nanny that waits its 4 s and then kills a slow-to-exit worker (a loaded
            # machine) says so as a warning, which is not the bake's business. A filter, not a level:
            # the cluster puts Dask's log levels back as it closes.
            nanny = logging.getLogger("distributed.nanny")
            nanny.addFilter(_errors_only)
            try:
                local.close(timeout=CLOSE_S)
            except Exception as exc:  # noqa: BLE001
                log.warning("closing the local Dask cluster: %s", first_line(exc))
            finally:
                nanny.removeFilter(_errors_only)
        self.dask_logs.restore()


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


class _DaskLogs:
    """Keeps Dask's own reports (workers registered, clients connected: INFO lines on every bake; a
    cancelled reconnection logged as an error) out of the bake's output unless texstream logs at
    DEBUG. Dask gives its loggers their own levels and handlers, so each is raised, then restored."""

    def __init__(self) -> None:
        self.saved: dict[str, int] = {}

    def quiet(self, level: int) -> None:
        if log.isEnabledFor(logging.DEBUG):
            return
        names = [n for n in logging.root.manager.loggerDict if n == "distributed" or n.startswith("distributed.")]
        for name in names:
            logger = logging.getLogger(name)
            if name == "distributed" or logger.level != logging.NOTSET:
                self.saved.setdefault(name, logger.level)
                logger.setLevel(max(level, logger.level))

    def restore(self) -> None:
        for name, level in self.saved.items():
            logging.getLogger(name).setLevel(level)
        self.saved.clear()


# ---- pool -----------------------------------------------------------------------------------------
class _ClusterTask(Task):
    """A `Task` whose job runs as a Dask future; `arrived` is set (by the client's thread) once it is done."""

    __slots__ = ("future", "arrived")

    def __init__(self, job: Any, future: Future) -> None:
        super().__init__(job)
        self.future = future
        self.arrived = threading.Event()
        future.add_done_callback(lambda _: self.arrived.set())


class ClusterPool:
    """Runs bake jobs on a cluster: `submit`, `result` (in any order), `close`, `kill` (the
    `workers.WorkerPool` interface)."""

    def __init__(self, connection: ClusterConnection, settings: Settings) -> None:
        self.connection = connection
        self.client = connection.client
        self.settings = settings
        self.bake_id = uuid.uuid4().hex[:12]  # task keys are unique across bakes sharing a scheduler
        self.submitted = 0
        self.outstanding: dict[str, _ClusterTask] = {}  # key -> task not yet taken

    def submit(self, job: BandJob | CutJob) -> Task:
        check_interrupt()
        kind = "band" if isinstance(job, BandJob) else "cut"
        key = f"texstream-{kind}-{self.bake_id}-{self.submitted}"
        self.submitted += 1
        # A band's rows are the task's own input (see the module docstring); they are tens of MiB
        # by design, which is what Dask's "large graph" warning is about.
        with dask.config.set({"distributed.admin.large-graph-warning-threshold": "2GiB"}):
            future = self.client.submit(run_job_in_this_process, self.settings, job, key=key, retries=RETRIES)
        task = _ClusterTask(job, future)
        self.outstanding[key] = task
        return task

    def result(self, task: Task) -> JobResult:
        """The task's result (its exception re-raised), waking every `POLL_S` for interrupts and to
        watch the cluster's health."""
        assert isinstance(task, _ClusterTask)
        while not task.arrived.wait(POLL_S):
            check_interrupt()
            self.connection.check()
        check_interrupt()
        future = task.future
        try:
            value = future.result()
        except KilledWorker as exc:
            raise EngineError(f"a bake task kept losing its Dask worker (out of memory or killed): {exc}") from None
        except CancelledError:  # the client lost the scheduler, and the scheduler its tasks
            raise self.connection.lost() from None
        finally:
            self.outstanding.pop(future.key, None)
            future.release()  # the worker may drop the result now
        task.finish(True, value)
        return value

    def close(self) -> None:
        """After a normal bake: nothing is outstanding; forget what is."""
        self._cancel()

    def kill(self) -> None:
        """After a failure or an interrupt: cancel every outstanding task at once."""
        self._cancel()

    def _cancel(self) -> None:
        futures = [t.future for t in self.outstanding.values()]
        self.outstanding.clear()
        if futures and self.client.status == "running":
            try:
                self.client.cancel(futures, force=True)
            except Exception as exc:  # noqa: BLE001 - the scheduler is gone: they are gone with it
                log.debug("cancelling bake tasks: %s", exc)


# ---- sources the workers read -------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerFileSource:
    """A file each worker opens itself, once per process (the `Source` protocol, ``parallel``): a
    few hundred bytes in each task instead of the band's rows. Its size and modification time are
    checked on every worker, so a worker never bakes another version of the file."""

    path: str
    name: str
    width: int
    height: int
    channels: int
    size: int
    mtime_ns: int
    url: str | None = None  # downloaded from here: a worker without the file fetches it itself
    url_version: str | None = None  # the version the bake downloaded (`RemoteVersion.key()`)
    parallel: bool = field(default=True, init=False)

    @classmethod
    def of(cls, source: Source) -> WorkerFileSource | None:
        """The description of `source` when workers can read it region by region, else None."""
        if not isinstance(source, VipsSource) or not source.region_readable:
            return None
        size, mtime_ns = source.file_stamp
        path = os.path.abspath(source.path)
        return cls(
            path,
            source.name,
            source.width,
            source.height,
            source.channels,
            size,
            mtime_ns,
            source.url,
            source.url_version,
        )

    def read_rows(self, y0: int, y1: int) -> np.ndarray:
        source = _open_on_worker(
            self.path, self.size, self.mtime_ns, self.width, self.height, self.url, self.url_version
        )
        return source.read_region(y0, y1)


@lru_cache(maxsize=4)
def _open_on_worker(
    path: str, size: int, mtime_ns: int, width: int, height: int, url: str | None, url_version: str | None
) -> VipsSource:
    host = socket.gethostname()
    if url is not None and not _same_file(path, size, mtime_ns):
        return _download_on_worker(url, url_version, width, height, host)
    try:
        st = os.stat(path)
    except OSError as exc:
        why = f"{path}: not readable on worker host {host} ({exc.strerror})"
        raise SourceError(f"{why}; a cluster bake's sources must be on storage every worker reads") from None
    if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
        raise SourceError(f"{path} on worker host {host} is not the file the bake opened (size or time differs)")
    source = VipsSource(path)
    if (source.width, source.height) != (width, height) or not source.region_readable:
        raise SourceError(f"{path} on worker host {host} does not read as the file the bake opened")
    return source


def _same_file(path: str, size: int, mtime_ns: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_size, st.st_mtime_ns) == (size, mtime_ns)


def _download_on_worker(url: str, version: str | None, width: int, height: int, host: str) -> VipsSource:
    """A URL source on a host that does not share the baking process's copy: fetched here once
    (the worker's own sources cache), and refused unless it reads as the file the bake opened."""
    from ..remote.download import download
    from ..remote.transport import RemoteError

    try:
        got = download(url)
    except RemoteError as exc:
        raise SourceError(f"on worker host {host}: {exc}") from None
    if got.version.key() != version:
        raise SourceError(f"{got.url} changed on the server since the bake opened it (seen from worker host {host})")
    source = VipsSource(got.path)
    if (source.width, source.height) != (width, height) or not source.region_readable:
        raise SourceError(f"{got.url} on worker host {host} does not read as the file the bake opened")
    return source


def worker_source(source: Source) -> Source | None:
    """What a cluster's workers read stage 0 from: the source itself when it pickles small
    (``parallel``), a `WorkerFileSource` for files read region by region, else None (the main
    process reads the source and ships the rows)."""
    if getattr(source, "parallel", False):
        return source
    return WorkerFileSource.of(source)


__all__ = ["ClusterConnection", "ClusterKind", "ClusterPool", "WorkerFileSource", "worker_source"]
