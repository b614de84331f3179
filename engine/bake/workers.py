"""Bake worker processes, and how a bake meets Ctrl-C and SIGTERM.

Workers are never forked from this process (it may run threads: libvips, tqdm, a GL driver):
they come from the multiprocessing fork server (started once, single-threaded, with the pipeline
imported), or are spawned where there is none. Each talks to this process over its own pipe, so
stopping one never leaves a half-written message that another reader would wait on forever.

Workers live no longer than the process that started them, even if it is killed with SIGKILL: each
holds the read end of a *lifeline* pipe whose write end only this process holds, and a thread in
the worker exits the process as soon as that pipe reports end-of-file. (On Linux a worker also asks
for SIGKILL when its own parent dies, PR_SET_PDEATHSIG; under the fork server that parent is the
server, which outlives the bake while any worker lives, hence the lifeline.)

Signals. A Python signal handler that raises runs wherever the main thread happens to be, including
inside a C library's callback into Python (pyvips' logging), where the exception is printed and lost
and the bake carries on. So while a bake runs, SIGINT and SIGTERM only note themselves
(`signals_deferred`); the bake checks at safe points (`check_interrupt`), and after it has stopped
its workers and removed its temporary file, the signal goes to the handler that was installed
before (KeyboardInterrupt for Ctrl-C; for SIGTERM the command line's handler, or termination).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import EngineError, first_line

if TYPE_CHECKING:  # imported where used: a bake in process starts no workers and needs neither
    import socket
    from multiprocessing import connection
    from multiprocessing.context import BaseContext

log = logging.getLogger(__name__)

POLL_S = 0.1  # how often a waiting bake looks for a noted signal
STOP_S = 5.0  # how long workers get to exit after a normal end before they are killed
KILL_S = 2.0  # how long a killed worker may take to be reaped (SIGKILL is not ignorable)

_start_lock = threading.RLock()  # one thread at a time starts worker processes (and sets their environment)


def worker_died(exitcode: int | None = None, error_line: str | None = None) -> EngineError:
    """The one-line error for a worker process that ended while the bake needed it: the worker's
    own first error line when it raised, the signal when it was killed (the kernel's out-of-memory
    killer sends SIGKILL), else its exit status."""
    if error_line:
        return EngineError(f"a bake worker process died: {error_line}")
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        cause = " (out of memory, or stopped by another program)" if -exitcode == signal.SIGKILL else ""
        return EngineError(f"a bake worker process died: killed by {name}{cause}")
    if exitcode:
        return EngineError(f"a bake worker process died (exit status {exitcode})")
    return EngineError("a bake worker process died")


# ---- how worker processes start --------------------------------------------------------------------
# A process started with `python -c` (the fork server, a spawned worker) puts the working folder first
# on sys.path, so a `zstandard.py` or a `texstream/` clone in the folder a user bakes from would be
# imported in place of the installed one. Workers start with PYTHONSAFEPATH (Python 3.11's -P), then
# take the bake process's own sys.path from multiprocessing: exactly the parent's entries.
_SAFE_PATH = "PYTHONSAFEPATH"
_SAFE_PATH_ADDED = "TEXSTREAM_WORKER_SAFE_PATH_ADDED"  # set when we added PYTHONSAFEPATH, not the user
ERROR_SOCKET = "TEXSTREAM_WORKER_ERROR_SOCKET"  # where a worker that raised reports its first line


def start_environment() -> dict[str, str]:
    """The environment variables a worker process starts with (see `forget_start_environment`)."""
    env = {}
    if not os.environ.get(_SAFE_PATH):
        env[_SAFE_PATH] = env[_SAFE_PATH_ADDED] = "1"
    address = _error_reports().address
    if address is not None:
        env[ERROR_SOCKET] = address
    return env


@contextlib.contextmanager
def worker_start_environment() -> Iterator[None]:
    """Within the block, processes start with `start_environment()` (the calling thread changes the
    process's environment only while it starts them, under one lock)."""
    with _start_lock:
        env = start_environment()
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def forget_start_environment() -> None:
    """In a worker: drop PYTHONSAFEPATH where only its start needed it, so that programs the worker
    runs get the user's environment."""
    if os.environ.pop(_SAFE_PATH_ADDED, None):
        os.environ.pop(_SAFE_PATH, None)


def report_error_line(error_line: str) -> bool:
    """In a worker that is about to die of an exception: send its first line to the bake process,
    which reports it; whether it was sent."""
    import socket

    address = os.environ.get(ERROR_SOCKET)
    if not address or not hasattr(socket, "AF_UNIX"):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(f"{os.getpid()} {error_line}".encode()[:2048], "\0" + address)
    except OSError:
        return False  # the bake process is gone or busy: the traceback on stderr says it
    return True


def _quiet() -> bool:
    """Whether a worker that reported its error leaves the traceback out (the bake prints the one
    line; TEXSTREAM_DEBUG=1 keeps the traceback, as for the command line's own errors)."""
    return os.environ.get("TEXSTREAM_DEBUG") != "1"


def install_error_report_hook() -> None:
    """In the fork server: a worker forked from it that fails before any of its own code runs (an
    import of the bake process's main module, unpickling its job) goes through `sys.excepthook`."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        if not (report_error_line(f"{kind.__name__}: {first_line(exc)}") and _quiet()):
            previous(kind, exc, tb)

    sys.excepthook = hook


class _ErrorReports:
    """The bake process's end of the workers' error reports: a datagram socket in Linux's abstract
    namespace (no file to clean up, gone with the process), read when a worker dies."""

    def __init__(self) -> None:
        self.address: str | None = None
        self.lines: dict[int, str] = {}
        self._socket: socket.socket | None = None
        if not sys.platform.startswith("linux"):
            return
        import socket

        address = f"texstream-bake-{os.getpid()}-{os.urandom(6).hex()}"
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind("\0" + address)
            sock.setblocking(False)
        except OSError:
            return
        self._socket, self.address = sock, address
        atexit.register(sock.close)  # it lives as long as the process: closed at exit, not left to finalizers

    def line_of(self, pid: int | None) -> str | None:
        while self._socket is not None:
            try:
                data = self._socket.recv(4096)
            except OSError:  # nothing more (BlockingIOError) or a closed socket
                break
            head, _, line = data.decode(errors="replace").partition(" ")
            if head.isdigit():
                self.lines[int(head)] = line
        return self.lines.pop(pid, None) if pid is not None else None


_reports: _ErrorReports | None = None
_reports_pid = -1


def _error_reports() -> _ErrorReports:
    global _reports, _reports_pid
    if _reports is None or _reports_pid != os.getpid():  # one per process (a forked child makes its own)
        _reports, _reports_pid = _ErrorReports(), os.getpid()
    return _reports


# ---- signals -------------------------------------------------------------------------------------
class Interrupted(BaseException):
    """A deferred SIGINT or SIGTERM unwinding a bake (caught by `signals_deferred`)."""


_noted: list[int] = []  # signals received while deferred, in order
_depth = 0  # nesting of signals_deferred (the outermost one installs and delivers)
_GROUP_SIGNALS = {signal.SIGINT}  # blocked while a process starts (SIGTERM kills one silently)


def _note(signum: int, frame: object) -> None:
    _noted.append(signum)  # nothing else: this may run inside any callback


def check_interrupt() -> None:
    """Raise `Interrupted` if a deferred signal arrived (call between units of work)."""
    if _noted:
        raise Interrupted(_noted[0])


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM only note themselves (main thread only; an ignored
    signal stays ignored). On the way out, a noted signal is handed to the handler that was there
    before, whether the block finished, raised `Interrupted` or failed otherwise: the interrupt
    wins over whatever error it caused."""
    global _depth
    if _depth or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        old = signal.getsignal(sig)
        if old is None or old == signal.SIG_IGN:
            continue
        previous[sig] = old
        signal.signal(sig, _note)
    _noted.clear()
    _depth += 1
    finished = False
    try:
        yield
        finished = True
    except BaseException:
        if not _noted:
            raise
    finally:
        _depth -= 1
        for sig, old in previous.items():
            signal.signal(sig, old)
    if _noted:
        signum = _noted[0]
        _noted.clear()
        _deliver(signum, previous[signum])
        if not finished:  # the previous handler returned, but the work was abandoned all the same
            raise KeyboardInterrupt


def _deliver(signum: int, handler: Any) -> None:
    if callable(handler):
        handler(signum, None)  # default_int_handler raises KeyboardInterrupt; the CLI's, its own
    elif handler == signal.SIG_DFL:
        sys.stderr.flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # the default action: terminate by this signal


# ---- worker side ---------------------------------------------------------------------------------
class PassedFd:
    """A file descriptor handed to a worker when it starts (duplicated through the start method)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple:
        from multiprocessing import reduction

        return _rebuild_fd, (reduction.DupFd(self.fd),)


def _rebuild_fd(dup: Any) -> PassedFd:
    return PassedFd(dup.detach())


def _tie_to_parent(lifeline: PassedFd, parent: int | None) -> None:
    """Exit when the bake process dies, however it dies."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the parent
        except (OSError, AttributeError):
            pass
        if parent is not None and os.getppid() != parent:  # it died before prctl took effect
            os._exit(1)
    fd = lifeline.fd

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        os._exit(1)  # end of file: the bake process is gone

    threading.Thread(target=watch, name="texstream-lifeline", daemon=True).start()


def _worker_main(
    conn: connection.Connection,
    lifeline: PassedFd,
    parent: int | None,
    init: Callable[..., None],
    initargs: tuple,
    run: Callable[[Any], Any],
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the bake decides
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _GROUP_SIGNALS)
    forget_start_environment()
    _tie_to_parent(lifeline, parent)
    try:
        init(*initargs)
    except Exception as exc:
        if report_error_line(f"{type(exc).__name__}: {first_line(exc)}") and _quiet():
            raise SystemExit(1) from None  # the bake prints the line; no traceback on the shared stderr
        raise
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        try:
            reply: tuple[bool, Any] = (True, run(job))
        except BaseException as exc:  # noqa: BLE001 - sent back and raised in the bake process
            reply = (False, exc)
        try:
            conn.send(reply)
        except (BrokenPipeError, ConnectionResetError):
            return
        except Exception as exc:  # an unpicklable result or exception: say what it was
            conn.send((False, EngineError(f"bake worker could not return its result: {exc!r}")))


# ---- bake side -----------------------------------------------------------------------------------
def _forkserver_env() -> dict[str, str]:
    """The fork server imports numpy; OpenBLAS would start a thread pool in it, and the server must
    stay single-threaded to fork safely (workers never use BLAS)."""
    keys = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    return {k: "1" for k in keys if k not in os.environ}


@contextlib.contextmanager
def _group_signals_blocked() -> Iterator[None]:
    """Start processes with Ctrl-C blocked (as multiprocessing starts its resource tracker): Ctrl-C
    reaches the whole process group, and must not kill the fork server or a worker while its
    interpreter starts, with a traceback on the shared stderr. They inherit the mask; workers unblock
    it once they ignore it (the server ignores it too). Meanwhile it waits, then reaches us."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def start_context() -> BaseContext:
    """The fork server (started here if needed, with the pipeline preloaded), else spawn."""
    import multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    from multiprocessing import forkserver, resource_tracker

    with _start_lock:
        ctx.set_forkserver_preload(["texstream.bake._preload"])  # pipeline and its tables
        with worker_start_environment():  # it is a `python -c` process too
            resource_tracker.ensure_running()  # first: it unblocks the signals it blocks for its start
        env = _forkserver_env()
        os.environ.update(env)  # only for the server's start: it copies the environment
        try:
            with worker_start_environment(), _group_signals_blocked():
                forkserver.ensure_running()
        finally:
            for k in env:
                os.environ.pop(k, None)
    return ctx


class Task:
    """One job given to the pool; `done` once its result (or error) came back."""

    __slots__ = ("job", "done", "ok", "value")

    def __init__(self, job: Any) -> None:
        self.job = job
        self.done = False
        self.ok = False
        self.value: Any = None

    def finish(self, ok: bool, value: Any) -> None:
        self.done, self.ok, self.value = True, ok, value


class _Worker:
    def __init__(self, process: Any, conn: connection.Connection) -> None:
        self.process = process
        self.conn = conn
        self.task: Task | None = None


class WorkerPool:
    """`count` worker processes, each running `init(*initargs)` once and then `run(job)` per job.

    Jobs go to idle workers in submission order, one at a time each (a job is only ever sent to a
    worker waiting for one, so neither side can block the other on a full pipe). `result` waits
    for a task, calling `check` every `POLL_S`; `close` ends the workers after a normal bake and
    `kill` at once after a failure or an interrupt; both return within a bounded time.
    """

    def __init__(
        self,
        count: int,
        init: Callable[..., None],
        initargs: tuple,
        run: Callable[[Any], Any],
        check: Callable[[], None] = check_interrupt,
    ) -> None:
        self.check = check
        self.queue: deque[Task] = deque()
        self.workers: list[_Worker] = []
        lifeline_r, self._lifeline = os.pipe()
        try:
            self._start(count, lifeline_r, init, initargs, run)
        except BaseException:
            self.kill()
            raise
        finally:
            os.close(lifeline_r)

    def _start(
        self, count: int, lifeline_r: int, init: Callable[..., None], initargs: tuple, run: Callable[[Any], Any]
    ) -> None:
        ctx = start_context()
        parent = os.getpid() if ctx.get_start_method() == "spawn" else None
        for i in range(count):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=_worker_main,
                name=f"texstream-bake-{i}",
                daemon=True,
                args=(theirs, PassedFd(lifeline_r), parent, init, initargs, run),
            )
            try:
                with worker_start_environment(), _group_signals_blocked():
                    proc.start()
            finally:
                theirs.close()
            self.workers.append(_Worker(proc, mine))

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers]

    def submit(self, job: Any) -> Task:
        task = Task(job)
        self.queue.append(task)
        self._dispatch()
        return task

    def _dispatch(self) -> None:
        for w in self.workers:
            if not self.queue:
                return
            if w.task is None:
                task = self.queue.popleft()
                try:
                    w.conn.send(task.job)
                except (BrokenPipeError, ConnectionResetError, EOFError):
                    raise self._died(w) from None
                w.task = task

    def result(self, task: Task) -> Any:
        """The task's result (its worker's exception re-raised), waiting as long as it takes."""
        while not task.done:
            self.check()
            self.poll(POLL_S)
        self.check()
        if not task.ok:
            raise task.value
        return task.value

    def poll(self, timeout: float) -> None:
        """Take the replies that arrive within `timeout`; raise if a worker died."""
        from multiprocessing import connection

        busy = {w.conn: w for w in self.workers if w.task is not None}
        sentinels = {w.process.sentinel: w for w in self.workers}
        ready = connection.wait([*busy, *sentinels], timeout)
        for obj in ready:
            w = busy.get(obj)  # type: ignore[call-overload]
            if w is not None:
                self._receive(w)
        for obj in ready:
            w = sentinels.get(obj)  # type: ignore[call-overload]
            if w is not None:
                if w.task is not None and w.conn.poll():
                    self._receive(w)  # its last reply came before it died
                raise self._died(w)
        self._dispatch()

    def _receive(self, w: _Worker) -> None:
        try:
            ok, value = w.conn.recv()
        except (EOFError, OSError):
            raise self._died(w) from None
        except Exception as exc:  # a reply that does not unpickle here (an odd exception type)
            ok, value = False, EngineError(f"bake worker returned what cannot be read back: {exc!r}")
        assert w.task is not None
        w.task.finish(ok, value)
        w.task = None

    def _died(self, w: _Worker) -> EngineError:
        """The error for a worker that ended: reaped first, so that its exit status is known."""
        with contextlib.suppress(OSError, ValueError, AssertionError):
            w.process.join(KILL_S)
        return worker_died(w.process.exitcode, _error_reports().line_of(w.process.pid))

    def close(self) -> None:
        """Ask idle workers to exit; kill any that has not within `STOP_S`."""
        for w in self.workers:
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(None)
        for w in self.workers:
            w.process.join(STOP_S)
        self.kill()

    def kill(self) -> None:
        """Stop every worker now (their results are not wanted) and reap them, in bounded time."""
        for w in self.workers:
            if w.process.exitcode is None:
                with contextlib.suppress(OSError, ValueError):
                    w.process.kill()
        for w in self.workers:
            with contextlib.suppress(OSError, ValueError, AssertionError):
                w.process.join(KILL_S)
            w.conn.close()
        self.queue.clear()
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1
