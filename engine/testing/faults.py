"""Fault injection: make the Nth file operation of the engine fail, the way a full or failing disk would.

The engine's writers (the pack writer and so every bake, the source download, the remote cache) do
their file operations through `texstream._io`. Inside ``with inject(Fault(at=n, errno=ENOSPC))``
the n-th of those operations (optionally only among some kinds) raises ``OSError(ENOSPC)`` instead
of running; everything else runs as usual. Outside such a block the operations are the plain `os`
functions, at no cost. A sweep in the style of SQLite's tests first counts the operations of a job
with `record()`, then runs the job once for every n, checking each time that it failed cleanly::

    with record() as dry:
        write_my_pack(path)
    for n in range(1, dry.count() + 1):
        with inject(Fault(at=n, errno=errno.EIO)) as log:
            with pytest.raises(OSError):
                write_my_pack(path)
        assert log.injected  # the fault was met

Kinds: ``open`` (creating or opening a file, temporary files too), ``write`` (through a buffered
file from ``fdopen`` or ``os.write``), ``pwrite``, ``read``, ``pread``, ``fsync``, ``chmod``,
``replace`` (the rename that publishes a file), ``truncate``, ``fallocate``, ``mmap``, ``mkdir``.

One block at a time per process (the hook is process-wide); operations of every thread count, so a
job swept this way must do its file operations in a fixed order. Worker processes do not inherit
an injection.
"""

from __future__ import annotations

import errno as errno_codes
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .. import _io

__all__ = ["KINDS", "Fault", "FaultLog", "Operation", "inject", "record"]

KINDS = frozenset(
    {"open", "write", "pwrite", "read", "pread", "fsync", "chmod", "replace", "truncate", "fallocate", "mmap", "mkdir"}
)


@dataclass(frozen=True, kw_only=True)
class Fault:
    """Which operation fails, and how.

    Parameters
    ----------
    at
        The operation that fails, counted from 1 among those of `kinds`.
    errno
        The error it fails with (``errno.ENOSPC``, ``errno.EIO``, ``errno.EDQUOT``...).
    kinds
        The kinds of operation counted (see the module's list); None: every kind.
    persistent
        Every counted operation from the `at`-th on fails too (a disk that stays full), not just
        that one (a transient error).
    """

    at: int
    errno: int = errno_codes.EIO
    kinds: frozenset[str] | None = None
    persistent: bool = False

    def __post_init__(self) -> None:
        if self.at < 1:
            raise ValueError(f"Fault.at counts from 1, got {self.at}")
        if self.kinds is not None:
            unknown = set(self.kinds) - KINDS
            if unknown:
                raise ValueError(f"unknown operation kinds {sorted(unknown)}; known: {sorted(KINDS)}")
            object.__setattr__(self, "kinds", frozenset(self.kinds))

    def counts(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds


@dataclass(frozen=True)
class Operation:
    """One operation the engine did (or was refused): its kind and what it acted on."""

    kind: str
    target: str  # a path, or ``fd <n>`` for an operation on a descriptor
    failed: bool = False


@dataclass
class FaultLog:
    """What happened inside an `inject` or `record` block."""

    operations: list[Operation] = field(default_factory=list)

    def count(self, kinds: frozenset[str] | set[str] | None = None) -> int:
        """How many operations of `kinds` (None: every kind) were done or refused."""
        return sum(1 for op in self.operations if kinds is None or op.kind in kinds)

    @property
    def injected(self) -> list[Operation]:
        """The operations that were made to fail."""
        return [op for op in self.operations if op.failed]


class _Injector:
    def __init__(self, fault: Fault | None, log: FaultLog) -> None:
        self.fault = fault
        self.log = log
        self.seen = 0  # operations of the fault's kinds so far
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def __call__(self, kind: str, target: Any) -> None:
        if os.getpid() != self.pid:  # a forked child: its operations are not the sweep's
            return
        path = target if isinstance(target, str | bytes | os.PathLike) else None
        name = os.fspath(path) if path is not None else f"fd {target}"
        fault = self.fault
        with self.lock:
            fails = False
            if fault is not None and fault.counts(kind):
                self.seen += 1
                fails = self.seen == fault.at or (fault.persistent and self.seen > fault.at)
            self.log.operations.append(Operation(kind, os.fsdecode(name), fails))
        if fails:
            assert fault is not None
            code = fault.errno
            if path is not None:  # as the OS reports it: path operations name their file
                raise OSError(code, os.strerror(code), os.fsdecode(path))
            raise OSError(code, os.strerror(code))


_active = threading.Lock()  # one injection at a time: the hook is process-wide


@contextmanager
def inject(fault: Fault | None) -> Iterator[FaultLog]:
    """Make the operation `fault` names fail inside the block (None: fail nothing, only record).

    Yields the `FaultLog` of the block's operations. RuntimeError if another block is active.
    """
    if not _active.acquire(blocking=False):
        raise RuntimeError("a fault injection is already active in this process")
    log = FaultLog()
    try:
        _io.set_fault_hook(_Injector(fault, log))
        try:
            yield log
        finally:
            _io.set_fault_hook(None)
    finally:
        _active.release()


@contextmanager
def record() -> Iterator[FaultLog]:
    """Record the block's file operations without failing any (the dry run that counts a sweep)."""
    with inject(None) as log:
        yield log
