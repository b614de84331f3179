"""The remote cache's file operations, in one place: a fault hook sees each one first.

`CacheFile` (a descriptor and its path), `rename_file` and `unlink_file` call the hook installed with
`fault_hook` before each operation (tests make the Nth fail with `FailNth`), and then the
`texstream._io` function, which `texstream.testing.faults` can fail too.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from .. import _io

__all__ = ["CacheFile", "CacheOp", "FailNth", "FaultHook", "fault_hook", "rename_file", "unlink_file"]


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


def check_op(op: CacheOp, path: str) -> None:
    hook = _hook
    if hook is not None:
        hook(op, path)


class CacheFile:
    """A file descriptor and its path; every call goes through the fault hook, and through
    `texstream._io` (so `texstream.testing.faults` sweeps the cache like every other writer)."""

    def __init__(self, path: Path, flags: int, mode: int = 0o600) -> None:
        self.path = str(path)
        check_op(CacheOp.OPEN, self.path)
        self.fd = _io.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, mode)

    def pread(self, size: int, offset: int) -> bytes:
        check_op(CacheOp.PREAD, self.path)
        return _io.pread(self.fd, size, offset)

    def preadv(self, buffers: list[memoryview], offset: int) -> int:
        check_op(CacheOp.PREAD, self.path)
        return os.preadv(self.fd, buffers, offset)

    def pwrite(self, data: bytes | memoryview, offset: int) -> None:
        """All of `data` at `offset`; a short write is an OSError (ENOSPC), as the disk is full."""
        check_op(CacheOp.PWRITE, self.path)
        if _io.pwrite(self.fd, data, offset) != len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)

    def fsync(self) -> None:
        check_op(CacheOp.FSYNC, self.path)
        _io.fsync(self.fd)

    def truncate(self, size: int) -> None:
        check_op(CacheOp.TRUNCATE, self.path)
        _io.ftruncate(self.fd, size)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def rename_file(src: Path, dst: Path) -> None:
    check_op(CacheOp.RENAME, str(dst))
    _io.replace(src, dst)


def unlink_file(path: Path) -> None:
    check_op(CacheOp.UNLINK, str(path))
    path.unlink(missing_ok=True)
