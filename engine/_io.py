"""The file operations of the engine's writers, in one place, so tests can make any of them fail.

The pack writer (and so every bake), the source download and the remote cache do their file
operations through the functions here: `open`, `mkstemp`, `fdopen`, `write`, `pwrite`, `read`,
`pread`, `fsync`, `fdatasync`, `fchmod`, `chmod`, `replace`, `ftruncate`, `fallocate`, `mmap`,
`makedirs` (and `sync_folder`, built on them). Each is the
plain `os` (or `tempfile`, `mmap`) function itself, so the indirection costs one attribute lookup,
the same as ``os.pwrite``. Call them as attributes (``_io.pwrite(...)``), never imported by name:
a test hook rebinds them.

`set_fault_hook(hook)` is that hook (`texstream.testing.faults` is its user-facing side): while
a hook is set, every function here first calls ``hook(kind, target)`` with the operation's kind
(``"open"``, ``"write"``, ``"pwrite"``, ``"pread"``, ``"read"``, ``"fsync"``, ``"chmod"``,
``"replace"``, ``"truncate"``, ``"fallocate"``, ``"mmap"``, ``"mkdir"``) and what it acts on (a
path, or a descriptor), and the hook may raise an `OSError` in the operation's place. A file object
from `fdopen` counts each ``write``/``read`` that reaches the operating system (a buffered file
writes when its buffer fills, on ``flush()`` and on ``close()``). `set_fault_hook(None)` puts the
plain functions back.
"""

from __future__ import annotations

import io
import mmap as _mmap
import os
import tempfile
from collections.abc import Callable
from typing import Any

__all__ = [
    "FaultHook",
    "chmod",
    "fallocate",
    "fchmod",
    "fdatasync",
    "fdopen",
    "fsync",
    "hooked",
    "makedirs",
    "mkstemp",
    "mmap",
    "open",
    "pread",
    "pwrite",
    "read",
    "replace",
    "set_fault_hook",
    "sync_folder",
    "write",
]

FaultHook = Callable[[str, Any], None]
"""Called as ``hook(kind, target)`` before an operation; raises OSError to make it fail."""


def _fallocate(fd: int, offset: int, length: int) -> None:
    os.posix_fallocate(fd, offset, length)


def _makedirs(path: str | os.PathLike[str], mode: int = 0o777, exist_ok: bool = True) -> None:
    os.makedirs(path, mode, exist_ok=exist_ok)


# The plain operations: what the names below are bound to while no hook is set.
_PLAIN: dict[str, Any] = {
    "open": os.open,
    "mkstemp": tempfile.mkstemp,
    "fdopen": os.fdopen,
    "write": os.write,
    "pwrite": os.pwrite,
    "read": os.read,
    "pread": os.pread,
    "fsync": os.fsync,
    "fdatasync": os.fdatasync,
    "fchmod": os.fchmod,
    "chmod": os.chmod,
    "replace": os.replace,
    "ftruncate": os.ftruncate,
    "fallocate": _fallocate,
    "mmap": _mmap.mmap,
    "makedirs": _makedirs,
}

open = os.open  # noqa: A001 - the module mirrors `os`: `_io.open` is `os.open`
mkstemp = tempfile.mkstemp
fdopen = os.fdopen
write = os.write
pwrite = os.pwrite
read = os.read
pread = os.pread
fsync = os.fsync
fdatasync = os.fdatasync
fchmod = os.fchmod
chmod = os.chmod
replace = os.replace
ftruncate = os.ftruncate
fallocate = _fallocate
mmap = _mmap.mmap
makedirs = _makedirs


class _CheckedRawFile(io.FileIO):
    """A raw file whose reads and writes (what a buffered file passes down) ask the hook first."""

    def __init__(self, fd: int, mode: str, hook: FaultHook) -> None:
        super().__init__(fd, mode, closefd=True)
        self._hook = hook

    def write(self, b: Any) -> int | None:  # type: ignore[override]
        self._hook("write", self.fileno())
        return super().write(b)

    def readinto(self, b: Any) -> int | None:  # type: ignore[override]
        self._hook("read", self.fileno())
        return super().readinto(b)


def _checked(hook: FaultHook) -> dict[str, Any]:
    def _open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        hook("open", path)
        return os.open(path, flags, mode, dir_fd=dir_fd)

    def _mkstemp(suffix: str | None = None, prefix: str | None = None, dir: Any = None) -> tuple[int, str]:  # noqa: A002
        hook("open", dir)
        return tempfile.mkstemp(suffix, prefix, dir)

    def _fdopen(fd: int, mode: str = "r", buffering: int = -1) -> Any:
        raw_mode = "r+" if "+" in mode else ("w" if "w" in mode or "a" in mode else "r")
        raw = _CheckedRawFile(fd, raw_mode, hook)
        size = buffering if buffering > 1 else io.DEFAULT_BUFFER_SIZE
        if "+" in mode:
            return io.BufferedRandom(raw, size)
        return io.BufferedWriter(raw, size) if raw_mode == "w" else io.BufferedReader(raw, size)

    def _write(fd: int, data: Any) -> int:
        hook("write", fd)
        return os.write(fd, data)

    def _pwrite(fd: int, data: Any, offset: int) -> int:
        hook("pwrite", fd)
        return os.pwrite(fd, data, offset)

    def _read(fd: int, length: int) -> bytes:
        hook("read", fd)
        return os.read(fd, length)

    def _pread(fd: int, length: int, offset: int) -> bytes:
        hook("pread", fd)
        return os.pread(fd, length, offset)

    def _fsync(fd: int) -> None:
        hook("fsync", fd)
        os.fsync(fd)

    def _fdatasync(fd: int) -> None:
        hook("fsync", fd)
        os.fdatasync(fd)

    def _fchmod(fd: int, mode: int) -> None:
        hook("chmod", fd)
        os.fchmod(fd, mode)

    def _chmod(path: Any, mode: int) -> None:
        hook("chmod", path)
        os.chmod(path, mode)

    def _replace(src: Any, dst: Any) -> None:
        try:
            hook("replace", dst)
        except OSError as exc:  # as rename(2)'s error reads: both names
            raise OSError(exc.errno, exc.strerror, os.fspath(src), None, os.fspath(dst)) from None
        os.replace(src, dst)

    def _ftruncate(fd: int, length: int) -> None:
        hook("truncate", fd)
        os.ftruncate(fd, length)

    def _fallocate_checked(fd: int, offset: int, length: int) -> None:
        hook("fallocate", fd)
        _fallocate(fd, offset, length)

    def _mmap_checked(fd: int, length: int, *args: Any, **kwargs: Any) -> _mmap.mmap:
        hook("mmap", fd)
        return _mmap.mmap(fd, length, *args, **kwargs)

    def _makedirs_checked(path: Any, mode: int = 0o777, exist_ok: bool = True) -> None:
        hook("mkdir", path)
        _makedirs(path, mode, exist_ok)

    return {
        "open": _open,
        "mkstemp": _mkstemp,
        "fdopen": _fdopen,
        "write": _write,
        "pwrite": _pwrite,
        "read": _read,
        "pread": _pread,
        "fsync": _fsync,
        "fdatasync": _fdatasync,
        "fchmod": _fchmod,
        "chmod": _chmod,
        "replace": _replace,
        "ftruncate": _ftruncate,
        "fallocate": _fallocate_checked,
        "mmap": _mmap_checked,
        "makedirs": _makedirs_checked,
    }


def sync_folder(folder: str | os.PathLike[str]) -> None:
    """fsync a folder, so a rename into it survives a crash; best effort: once a file is renamed
    into place it is the output, and a folder that cannot be synced is no reason to report failure."""
    try:
        fd = open(os.fspath(folder) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def set_fault_hook(hook: FaultHook | None) -> None:
    """Route every operation here through `hook` (None: the plain functions again, at no cost).

    A test hook, not a setting: `texstream.testing.faults.inject` sets and clears it around a block.
    """
    functions = _PLAIN if hook is None else _checked(hook)
    globals().update(functions)


def hooked() -> bool:
    """Whether a fault hook is set."""
    return globals()["pwrite"] is not os.pwrite
