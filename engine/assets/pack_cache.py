"""A folder of packs named by a content key, shared by every process of the user, bounded in size.

Layout of the folder (``$TEXSTREAM_CACHE/packs`` by default):

``<key>.tpk``     the pack, written by `PackWriter` (temporary file + rename: never seen half-written)
``<key>.json``    its record: what it was baked from, and a seal of the pack file's identity; the
                  record's modification time is the pack's last use (touched on every use)
``<key>.lease``   lock file: each process using the pack holds a shared flock on it; eviction takes
                  it exclusively without waiting, so a pack some process holds is never deleted
``<key>.bake``    lock file: the process baking the pack holds it exclusively; another process asking
                  for the same key waits on it, then uses the first one's pack
``notes/``        small JSON notes keyed by name (source digests, content facts), bounded in number

The seal is the pack file's (size, mtime_ns, ctime_ns, inode) right after the bake. A pack whose
seal still matches is used as it is; one whose seal differs (written to, copied, restored) is checked
whole (`PackReader.verify`) and re-sealed when good or baked again when not. A bit flip that leaves
the file's metadata alone is caught later, by the per-tile checksums every read checks.

Eviction (after each bake, under ``cleanup.lock`` so one process cleans at a time) removes the least
recently used packs until the folder's packs total at most `PackCacheConfig.max_mb`; it skips leased
packs and the pack just baked.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import cache_dir
from ..errors import EngineError, PackFormatError
from ..pack.writer import remove_stale_temps

log = logging.getLogger(__name__)

__all__ = ["CacheEntry", "PackCache", "PackCacheConfig", "VerifyPolicy"]

DEFAULT_MAX_MB = 8192.0  # 8 GiB of packs
MAX_NOTES = 4096  # notes kept (oldest removed first); each a few hundred bytes
MAX_RECORD_BYTES = 1 << 16
_KEY = re.compile(r"[0-9a-f]{32}")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class VerifyPolicy(enum.Enum):
    """When a cached pack's tiles are all read and checked before it is handed out."""

    ON_CHANGE = "on-change"  # when its seal no longer matches the file (the default)
    ALWAYS = "always"  # on every use (reads the whole pack each time)


class PackState(enum.Enum):
    """What a lookup found under a key."""

    MISSING = "missing"
    USABLE = "usable"
    CORRUPT = "corrupt"


@dataclass(frozen=True, kw_only=True)
class PackCacheConfig:
    """Where the pack cache lives and how big it may grow.

    Attributes
    ----------
    folder : str | os.PathLike | None
        None: ``cache_dir() / "packs"`` ($TEXSTREAM_CACHE/packs)
    max_mb : float | None
        the packs' total size bound; None: $TEXSTREAM_PACK_CACHE_MB, else 8192 (8 GiB). A single pack
        larger than the bound is kept (it was just asked for) and evicts everything unleased
    verify : VerifyPolicy
        when a cached pack is checked whole before use (see `VerifyPolicy`)
    """

    folder: str | os.PathLike[str] | None = None
    max_mb: float | None = None
    verify: VerifyPolicy = VerifyPolicy.ON_CHANGE

    def __post_init__(self) -> None:
        object.__setattr__(self, "verify", VerifyPolicy(self.verify))
        if self.max_mb is not None and not (isinstance(self.max_mb, int | float) and 0 <= self.max_mb < float("inf")):
            raise ValueError(f"pack cache max_mb must be a finite number >= 0, got {self.max_mb!r}")

    @property
    def path(self) -> Path:
        return Path(self.folder) if self.folder is not None else cache_dir() / "packs"

    @property
    def max_bytes(self) -> int:
        mb = self.max_mb
        if mb is None:
            env = os.environ.get("TEXSTREAM_PACK_CACHE_MB")
            try:
                mb = float(env) if env else DEFAULT_MAX_MB
            except ValueError:
                raise ValueError(f"TEXSTREAM_PACK_CACHE_MB must be a number of MiB, got {env!r}") from None
            if not 0 <= mb < float("inf"):
                raise ValueError(f"TEXSTREAM_PACK_CACHE_MB must be a finite number >= 0, got {env!r}")
        return int(mb * (1 << 20))


@dataclass(frozen=True, kw_only=True)
class CacheEntry:
    """One cached pack as `PackCache.entries` lists it."""

    key: str
    path: Path
    size: int
    last_used: float  # seconds since the epoch
    record: dict


def _lock(path: Path, *, shared: bool, wait: bool) -> int | None:
    """A flock on `path` (created if needed), as a descriptor; None when `wait` is False and another
    holder conflicts. The lock is taken on the file the path names once locked: a lock file removed
    (by eviction) while waiting for it is opened again."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _seal(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def write_json_atomic(path: Path, data: dict) -> None:
    """`data` as JSON at `path` through a temporary file and a rename (readers see old or new)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(json.dumps(data, sort_keys=True))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict | None:
    """A small JSON object file; None when missing, oversized or not such an object."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
    except (FileNotFoundError, IsADirectoryError):
        return None
    if len(data) > MAX_RECORD_BYTES:
        return None
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


class PackCache:
    """The content-addressed pack folder (see the module docstring for its layout and rules).

    `get` and `get_or_bake` hand out a pack's path and count one hold on its lease (a shared lock,
    taken once per key and cache object): the lock is dropped when every hold is given back with
    `release`, on `close`, or when this process exits. A pack reader opened through
    `texstream.assets.open_pack_reader` gives its hold back when it closes. `on_bake` (a test and
    telemetry hook) is called with the key just before each bake this object runs.
    """

    def __init__(self, config: PackCacheConfig | None = None, *, on_bake: Callable[[str], None] | None = None) -> None:
        self.config = config or PackCacheConfig()
        if not isinstance(self.config, PackCacheConfig):
            raise TypeError(f"config must be a PackCacheConfig, got {type(self.config).__name__}")
        self.folder = self.config.path
        self.max_bytes = self.config.max_bytes
        self.on_bake = on_bake
        self._leases: dict[str, int] = {}  # key -> the lease's lock descriptor
        self._holds: dict[str, int] = {}  # key -> holds handed out on it (its lock is dropped at 0)
        self._mutex = threading.Lock()  # guards _leases and _holds

    # ---- paths ----------------------------------------------------------------------------------
    def pack_path(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"cache key must be 32 lowercase hex digits, got {key!r}")
        return self.folder / f"{key}.tpk"

    def _file(self, key: str, suffix: str) -> Path:
        return self.folder / f"{key}{suffix}"

    def _ensure_folder(self) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / "notes").mkdir(exist_ok=True)
        except OSError as exc:
            raise EngineError(f"cannot create the pack cache folder {self.folder}: {exc.strerror or exc}") from None

    # ---- notes ----------------------------------------------------------------------------------
    def read_note(self, name: str) -> dict | None:
        """A note written by `write_note` (None when absent or unreadable); touches it."""
        path = self.folder / "notes" / f"{name}.json"
        note = read_json(path)
        if note is not None:
            with contextlib.suppress(OSError):
                os.utime(path)
        return note

    def write_note(self, name: str, data: dict) -> None:
        self._ensure_folder()
        write_json_atomic(self.folder / "notes" / f"{name}.json", data)

    # ---- leases ---------------------------------------------------------------------------------
    def _lease(self, key: str) -> None:
        """One more hold on `key`'s lease, taking its lock first when this object has none."""
        with self._mutex:
            if key in self._leases:
                self._holds[key] += 1
                return
        fd = _lock(self._file(key, ".lease"), shared=True, wait=True)
        assert fd is not None
        with self._mutex:
            if key in self._leases:  # another thread of this process got there first
                os.close(fd)
            else:
                self._leases[key] = fd
            self._holds[key] = self._holds.get(key, 0) + 1

    def release(self, key_or_path: str | os.PathLike[str]) -> None:
        """Give back one hold on a pack's lease (by key or by the path `get_or_bake` returned); the
        lock is dropped with the last hold, and the pack may then be evicted. Releasing a pack this
        object holds nothing on does nothing."""
        key = Path(key_or_path).name.removesuffix(".tpk")
        with self._mutex:
            holds = self._holds.get(key, 0) - 1
            if holds > 0:
                self._holds[key] = holds
                return
            self._holds.pop(key, None)
            fd = self._leases.pop(key, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Drop every lease this object holds, whatever holds are still out."""
        with self._mutex:
            fds, self._leases, self._holds = list(self._leases.values()), {}, {}
        for fd in fds:
            os.close(fd)

    def holds(self, key_or_path: str | os.PathLike[str]) -> int:
        """Holds handed out and not yet released on a pack's lease (0: not leased by this object)."""
        key = Path(key_or_path).name.removesuffix(".tpk")
        with self._mutex:
            return self._holds.get(key, 0)

    def __enter__(self) -> PackCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def leased(self) -> set[str]:
        """Keys this object holds a lease on."""
        with self._mutex:
            return set(self._leases)

    # ---- lookup and bake --------------------------------------------------------------------------
    def state(self, key: str, *, baking: bool = False) -> PackState:
        """Whether the pack under `key` exists and may be used (checked whole when its seal differs).

        A pack without a record is either one whose baker died between the rename and the record
        (checked whole, then used) or one whose bake is finishing right now (MISSING: the caller waits
        for the bake lock); `baking` says the caller holds that lock itself."""
        path = self.pack_path(key)
        try:
            seal = _seal(path)
        except FileNotFoundError:
            return PackState.MISSING
        record = read_json(self._file(key, ".json"))
        if record is not None and record.get("seal") == seal and self.config.verify is VerifyPolicy.ON_CHANGE:
            return PackState.USABLE
        if record is None and not baking:
            probe = _lock(self._file(key, ".bake"), shared=False, wait=False)
            if probe is None:
                return PackState.MISSING  # its baker is writing the record
            os.close(probe)
        from ..pack.reader import PackReader

        try:
            with PackReader(path) as reader:
                bad = reader.verify()
        except (PackFormatError, OSError) as exc:
            log.warning("cached pack %s is unreadable (%s): it will be baked again", path, exc)
            return PackState.CORRUPT
        if bad:
            log.warning(
                "cached pack %s has %d bad tiles (first: %s): it will be baked again", path, len(bad), bad[0][3]
            )
            return PackState.CORRUPT
        if record is None or record.get("seal") != seal:  # good as it is now: sealed so
            record = record or {"key": key, "recovered": True}
            record["seal"] = _seal(path)
            write_json_atomic(self._file(key, ".json"), record)
        return PackState.USABLE

    def get(self, key: str) -> Path | None:
        """The pack under `key`, leased and touched, or None when there is none usable (no bake)."""
        self._ensure_folder()
        self._lease(key)
        if self.state(key) is PackState.USABLE:
            self._touch(key)
            return self.pack_path(key)
        self.release(key)
        return None

    def get_or_bake(
        self,
        key: str,
        bake: Callable[[Path], dict],
        *,
        on_wait: Callable[[], None] | None = None,
    ) -> tuple[Path, bool]:
        """The pack under `key`, baked by ``bake(path)`` unless a usable one is there; leased.

        `bake` writes the pack at the path it is given (atomically, as `PackWriter` does) and returns
        what the record should hold about it. One process bakes a key at a time; another asking
        meanwhile waits (`on_wait` is called first) and then uses that pack. Returns the path and
        whether this call baked it.
        """
        self._ensure_folder()
        path = self.pack_path(key)
        self._lease(key)  # before the bake: eviction never takes a pack being made or used
        try:
            if self.state(key) is PackState.USABLE:
                self._touch(key)
                return path, False
            bake_fd = _lock(self._file(key, ".bake"), shared=False, wait=False)
            if bake_fd is None:
                if on_wait is not None:
                    on_wait()
                bake_fd = _lock(self._file(key, ".bake"), shared=False, wait=True)
            assert bake_fd is not None
            try:
                if self.state(key, baking=True) is PackState.USABLE:  # baked by the process we waited for
                    self._touch(key)
                    return path, False
                if self.on_bake is not None:
                    self.on_bake(key)
                started = time.time()
                about = bake(path)
                if not path.is_file():
                    raise EngineError(f"the bake for cache key {key} wrote no pack at {path}")
                record = {"key": key, "baked_at": started, "bake_seconds": time.time() - started, **about}
                record["seal"] = _seal(path)
                write_json_atomic(self._file(key, ".json"), record)
            finally:
                os.close(bake_fd)
        except BaseException:
            self.release(key)
            raise
        self.cleanup(keep={key})
        return path, True

    def _touch(self, key: str) -> None:
        with contextlib.suppress(OSError):
            os.utime(self._file(key, ".json"))

    # ---- size bound -------------------------------------------------------------------------------
    def entries(self) -> list[CacheEntry]:
        """Every cached pack, least recently used first."""
        found = []
        try:
            names = [e.name for e in os.scandir(self.folder) if e.name.endswith(".tpk")]
        except FileNotFoundError:
            return []
        for name in names:
            key = name[: -len(".tpk")]
            if not _KEY.fullmatch(key):
                continue
            pack = self.folder / name
            try:
                size = pack.stat().st_size
                used = pack.stat().st_mtime
            except FileNotFoundError:
                continue
            record_path = self._file(key, ".json")
            with contextlib.suppress(FileNotFoundError):
                used = record_path.stat().st_mtime
            found.append(CacheEntry(key=key, path=pack, size=size, last_used=used, record=read_json(record_path) or {}))
        found.sort(key=lambda e: (e.last_used, e.key))
        return found

    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries())

    def cleanup(self, keep: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
        """Evict least recently used packs until the total is within the bound; returns the keys
        evicted. Leased packs (by any process, this one included) and `keep` stay. Also removes
        temporary files of dead writers and the oldest notes beyond `MAX_NOTES`."""
        if not self.folder.is_dir():
            return []
        guard = _lock(self.folder / "cleanup.lock", shared=False, wait=False)
        if guard is None:  # another process is cleaning right now
            return []
        try:
            self._remove_stale_temps()
            self._trim_notes()
            entries = self.entries()
            total = sum(e.size for e in entries)
            evicted = []
            for entry in entries:
                if total <= self.max_bytes:
                    break
                if entry.key in keep or not self._evict(entry.key):
                    continue
                total -= entry.size
                evicted.append(entry.key)
                log.info(
                    "pack cache: evicted %s (%s, %.1f MiB)", entry.key, entry.record.get("source"), entry.size / 2**20
                )
            return evicted
        finally:
            os.close(guard)

    def _evict(self, key: str) -> bool:
        lease = _lock(self._file(key, ".lease"), shared=False, wait=False)
        if lease is None:
            return False  # some process holds it
        try:
            bake = _lock(self._file(key, ".bake"), shared=False, wait=False)
            if bake is None:
                return False  # being baked again right now
            try:
                for suffix in (".tpk", ".json", ".bake", ".lease"):
                    self._file(key, suffix).unlink(missing_ok=True)
            finally:
                os.close(bake)
        finally:
            os.close(lease)
        return True

    def _remove_stale_temps(self) -> None:
        pattern = re.compile(r"\.([0-9a-f]{32}\.tpk)\.\d+\.[^.]+\.tmp")
        with contextlib.suppress(OSError):
            outputs = {m.group(1) for e in os.scandir(self.folder) if (m := pattern.fullmatch(e.name))}
            for name in outputs:
                remove_stale_temps(self.folder / name)

    def _trim_notes(self) -> None:
        notes = self.folder / "notes"
        try:
            found = [(e.stat().st_mtime, e.path) for e in os.scandir(notes) if e.name.endswith(".json")]
        except OSError:
            return
        if len(found) <= MAX_NOTES:
            return
        found.sort()
        for _, path in found[: len(found) - MAX_NOTES]:
            with contextlib.suppress(OSError):
                os.unlink(path)
