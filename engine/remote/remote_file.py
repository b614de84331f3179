"""A pack file on a server or object store, read by ranges through the on-disk block cache.

`read_runs` is what the I/O threads call: byte runs (each one or more tiles adjacent in the file)
are turned into the blocks of `RemoteConfig.block_kb` that cover them; blocks found in the cache are
read from disk, the missing ones are coalesced into requests of up to `max_request_kb` (adjacent
blocks, one request) and fetched `max_requests` at a time on this file's fetch threads, then cached.

Failures: a request failing transiently (refused, reset or closed connections, timeouts, HTTP 429
and 5xx) is retried `retries` times with doubling, jittered backoff, or after the server's
Retry-After when that is longer, all within `request_deadline_s`; a keep-alive connection the
server closed is retried at once, once, on top. Every retry counts in `RemoteStats.retries`. A range
that still fails fails the runs that need it (their tiles count as failed and are retried later by
the streamer's scheduler). After a range failed because the server could not be reached, requests
fail at once for `offline_s` (one probe then decides), and after a Retry-After longer than the
request's time left, for that long (at most `retry_after_cap_s`): a server that went away or asked
for quiet costs no more than one request per window, and streaming resumes when it is back.

A version mismatch (the pack changed on the server) fails with `errno.ESTALE`, never with bytes of
the other version, and makes the file STALE (`status()`): requests then fail at once, but every
`stale_recheck_s` one asks whether the opened version is back; when it is, the file is OK again and
tiles load again.
"""

from __future__ import annotations

import enum
import errno
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from .cache import BlockCache, CacheUnavailable
from .network import RemoteStats
from .transport import (
    FsspecTransport,
    HttpTransport,
    PackChangedError,
    PermanentError,
    RemoteError,
    RemoteVersion,
    TransientError,
    Transport,
    redact,
)
from .urls import is_remote

if TYPE_CHECKING:
    from ..config import RemoteConfig

__all__ = [
    "RemoteFile",
    "RemoteStats",
    "SourceState",
    "SourceStatus",
    "is_remote",
    "open_remote",
]

log = logging.getLogger(__name__)

PROBE_BYTES = 64 << 10  # the first request: header, level table and (small packs) the index
LATENCY_SAMPLES = 512
_T = TypeVar("_T")


class SourceState(enum.Enum):
    """Whether a pack's bytes can be read now."""

    OK = "ok"
    OFFLINE = "offline"  # the server could not be reached or asked to wait: requests fail at once for a while
    STALE = "stale"  # the pack changed on the server: uncached bytes fail until the opened version is back


@dataclass(frozen=True)
class SourceStatus:
    """A pack's `SourceState` and, unless OK, why (one line, e.g. "the pack changed on the server ...")."""

    state: SourceState
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.state.value}: {self.reason}" if self.reason else self.state.value


SOURCE_OK = SourceStatus(SourceState.OK)


class _SharedCache:
    """Process-wide registry: one `BlockCache` per folder, open while some remote file uses it."""

    lock = threading.Lock()
    caches: dict[Path, tuple[BlockCache, int]] = {}
    refused: set[Path] = set()  # folders that could not be used (warned once)

    @classmethod
    def acquire(cls, config: RemoteConfig) -> BlockCache | None:
        if config.cache_bytes < config.block_bytes:
            return None
        from ..config import cache_dir

        folder = Path(config.cache_dir) if config.cache_dir else cache_dir() / "remote"
        folder = folder.expanduser().absolute()
        with cls.lock:
            held = cls.caches.get(folder)
            if held is not None:
                cls.caches[folder] = (held[0], held[1] + 1)
                return held[0]
            try:
                cache = BlockCache(folder, config.cache_bytes, config.block_bytes)
            except CacheUnavailable as exc:
                if folder not in cls.refused:
                    cls.refused.add(folder)
                    log.warning("remote packs run without a disk cache: %s", exc)
                return None
            cls.caches[folder] = (cache, 1)
            return cache

    @classmethod
    def release(cls, cache: BlockCache) -> None:
        with cls.lock:
            held = cls.caches.get(cache.directory)
            if held is None or held[0] is not cache:
                return
            if held[1] > 1:
                cls.caches[cache.directory] = (cache, held[1] - 1)
                return
            del cls.caches[cache.directory]
        cache.close()


@dataclass(frozen=True)
class _Span:
    """Blocks [first, last] of the file, fetched with one request."""

    first: int
    last: int


class RemoteFile:
    """One remote pack: its version, fetch threads, statistics and a handle on the shared cache.

    Thread-safe. Reference-counted (`share` / `close`) so the reader and the streamer's uploader can
    each close their handle whenever their owner likes.
    """

    def __init__(self, url: str, config: RemoteConfig) -> None:
        self.url = url
        self.name = redact(url)
        self.config = config
        self._transport: Transport = _make_transport(url, config)
        self._lock = threading.Lock()
        self._in_flight = threading.BoundedSemaphore(config.max_requests)
        self._refs = 1
        self._requests = self._failed = self._retries = self._bytes = self._hits = self._misses = 0
        self._latency: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self._offline_until = 0.0  # requests fail at once until then (unreachable, or Retry-After)
        self._offline_errno = errno.ECONNREFUSED
        self._offline_reason = ""
        self._stale = ""  # why the pack is STALE ("" while it is the version opened)
        self._stale_check_at = 0.0  # when the next request may ask whether the opened version is back
        self._last_error = ""  # why the latest range failed (for messages)
        self._head = b""
        self._executor: ThreadPoolExecutor | None = None
        self._cache: BlockCache | None = None
        try:
            self.version, first = self._probe()
            self.size = self.version.size
            # the first blocks stay in memory (whole blocks, or the whole file when shorter): the
            # header and level table are read from there even without a disk cache
            self._head = first
            self._cache = _SharedCache.acquire(config)
            if self._cache is not None:
                self._pack_id, self._url_id = BlockCache.pack_ids(url, self.version.key())
                blocks = -(-self.size // config.block_bytes)
                freed = self._cache.adopt(self._pack_id, self._url_id, blocks)
                if freed:
                    log.info("%s changed since it was cached: %d old blocks dropped", self.name, freed)
                self._store(0, first)
        except BaseException:
            self._shutdown()
            raise

    def _probe(self) -> tuple[RemoteVersion, bytes]:
        """Version and first blocks, retried like any request; a failure is one RemoteError line."""
        cfg = self.config
        block = cfg.block_bytes
        want = max(block, PROBE_BYTES // block * block)
        deadline = time.monotonic() + cfg.request_deadline_s
        try:
            version, data = self._with_retries(
                lambda: self._transport.probe(want, deadline), deadline, lambda got: len(got[1])
            )
        except (TransientError, PermanentError, PackChangedError) as exc:
            raise RemoteError(f"{self.name}: {exc}") from None
        if len(data) != min(want, version.size):
            raise RemoteError(f"{self.name}: the first request returned {len(data)} bytes")
        return version, data

    # ---- handles -----------------------------------------------------------------------------------------
    def share(self) -> RemoteFile:
        """Another handle on this file (closed with `close`)."""
        with self._lock:
            if self._refs <= 0:
                raise RemoteError(f"{self.name}: closed")
            self._refs += 1
        return self

    def close(self) -> None:
        with self._lock:
            if self._refs <= 0:
                return
            self._refs -= 1
            if self._refs:
                return
        self._shutdown()

    def _shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if self._cache is not None:
            _SharedCache.release(self._cache)
            self._cache = None
        self._transport.close()

    # ---- reads -------------------------------------------------------------------------------------------
    def read_into(self, out: memoryview, offset: int) -> None:
        """`len(out)` bytes at `offset` (the reader's header, index and single tiles); RemoteError."""
        buf = np.frombuffer(out, np.uint8) if not out.readonly else None
        if buf is None:
            raise ValueError("read_into needs a writable buffer")
        err = self.read_runs(np.array([offset], np.int64), np.array([len(out)], np.int64), buf, np.zeros(1, np.int64))
        if err[0]:
            why = self.describe_error(int(err[0]))
            if self._last_error and self._last_error not in why:
                why = f"{why} ({self._last_error})"
            raise RemoteError(f"{self.name}: cannot read {len(out)} bytes at {offset}: {why}")

    def read_runs(self, starts: np.ndarray, lengths: np.ndarray, buf: np.ndarray, where: np.ndarray) -> np.ndarray:
        """Read run i (`lengths[i]` bytes at file offset `starts[i]`) into `buf[where[i]:]`.

        Returns an errno per run: 0 read, ESTALE the pack changed on the server, else why it failed
        (the run's bytes in `buf` are then unspecified).
        """
        n = int(starts.size)
        err = np.zeros(n, np.int32)
        if n == 0:
            return err
        ends = starts + lengths
        past = (starts < 0) | (lengths <= 0) | (ends > self.size)
        err[past] = errno.EINVAL
        block = self.config.block_bytes
        first, last = starts // block, (ends - 1) // block
        ok = ~past
        counts = np.where(ok, last - first + 1, 0)
        needed = np.unique(np.repeat(first, counts) + _ramp(counts)) if counts.sum() else np.zeros(0, np.int64)
        # every needed block lands in one row of `blocks`: a run's blocks are adjacent rows, so each
        # run is then one copy; the rows come from the first bytes kept in memory, the disk cache
        # (one read per stretch adjacent there) or the network
        blocks = np.empty((needed.size, block), np.uint8)
        flat = blocks.reshape(-1)
        block_len = np.minimum(self.size - needed * block, block)  # the pack's last block may be short
        head_rows = int(np.searchsorted(needed, -(-len(self._head) // block)))
        for r in range(head_rows):
            b = int(needed[r])
            piece = self._head[b * block : (b + 1) * block]
            flat[r * block : r * block + len(piece)] = np.frombuffer(piece, np.uint8)
        have = np.zeros(needed.size, bool)
        have[:head_rows] = True
        cache = self._cache
        if cache is not None and head_rows < needed.size:
            have[head_rows:] = cache.read_blocks(
                self._pack_id, needed[head_rows:], block_len[head_rows:], blocks[head_rows:]
            )
        missing = needed[~have].tolist()
        with self._lock:
            self._hits += len(needed) - len(missing)
            self._misses += len(missing)
        failed = np.zeros(needed.size, np.int32)  # errno per row
        for span, outcome in self._fetch_all(self._spans(missing)):
            row = int(np.searchsorted(needed, span.first))
            rows = row + span.last - span.first + 1
            if isinstance(outcome, int):
                failed[row:rows] = outcome
                continue
            flat[row * block : row * block + len(outcome)] = np.frombuffer(outcome, np.uint8)
            self._store(span.first, outcome)
        runs = np.flatnonzero(ok)
        row0 = np.searchsorted(needed, first[runs])
        bad_before = np.concatenate([[0], np.cumsum(failed != 0)])
        run_failed = bad_before[row0 + (last - first)[runs] + 1] - bad_before[row0] > 0
        for i, r in zip(runs[run_failed].tolist(), row0[run_failed].tolist(), strict=True):
            rows_of_run = failed[r : r + int(last[i] - first[i]) + 1]
            err[i] = rows_of_run[rows_of_run != 0][0]
        good = ~run_failed
        src = (row0 * block + starts[runs] - first[runs] * block)[good]
        size = (ends - starts)[runs][good]
        for s0, at, n_run in zip(src.tolist(), where[runs][good].tolist(), size.tolist(), strict=True):
            buf[at : at + n_run] = flat[s0 : s0 + n_run]
        return err

    def _spans(self, blocks: list[int]) -> list[_Span]:
        """Runs of consecutive blocks, each at most `max_request_kb`."""
        most = max(1, self.config.max_request_kb * 1024 // self.config.block_bytes)
        spans: list[_Span] = []
        for b in blocks:
            if spans and b == spans[-1].last + 1 and b - spans[-1].first < most:
                spans[-1] = _Span(spans[-1].first, b)
            else:
                spans.append(_Span(b, b))
        return spans

    def _fetch_all(self, spans: list[_Span]) -> list[tuple[_Span, bytes | int]]:
        if len(spans) <= 1:
            return [(s, self._fetch_span(s)) for s in spans]
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.config.max_requests, thread_name_prefix="texstream-net")
            executor = self._executor
        return list(zip(spans, executor.map(self._fetch_span, spans), strict=True))

    def _fetch_span(self, span: _Span) -> bytes | int:
        """The span's bytes, or the errno it failed with after the retries."""
        cfg = self.config
        block = cfg.block_bytes
        start = span.first * block
        length = min((span.last + 1) * block, self.size) - start
        deadline = time.monotonic() + cfg.request_deadline_s
        refused = self._fail_at_once(deadline)
        if refused:
            return refused
        try:
            data = self._with_retries(
                lambda: self._transport.fetch(start, length, self.version, deadline), deadline, len
            )
        except PackChangedError as exc:
            self._mark_changed(str(exc))
            self._last_error = str(exc)
            return errno.ESTALE
        except (PermanentError, TransientError) as exc:
            log.warning("%s: %s", self.name, exc)
            self._last_error = str(exc)
            return exc.errnum
        return data

    def _fail_at_once(self, deadline: float) -> int:
        """The errno to fail a request with without sending it (offline or stale), else 0.

        While STALE, one request per `stale_recheck_s` asks the server whether the opened version is
        back (the others fail at once meanwhile); when it is, the file is OK again.
        """
        now = time.monotonic()
        with self._lock:
            if self._stale:
                if now < self._stale_check_at:
                    self._last_error = self._stale
                    return errno.ESTALE
                self._stale_check_at = now + self.config.stale_recheck_s  # this request is the check
            elif now < self._offline_until:
                self._last_error = self._offline_reason
                return self._offline_errno
            else:
                return 0
        return 0 if self._recheck_version(deadline) else errno.ESTALE

    def _recheck_version(self, deadline: float) -> bool:
        """One request: is the pack on the server the version opened again? True clears STALE."""
        t0 = time.perf_counter()
        try:
            with self._in_flight:
                same = self._transport.revalidate(self.version, deadline)
        except (TransientError, PermanentError) as exc:
            self._note(time.perf_counter() - t0, 0, ok=False)
            self._last_error = f"{self._stale} (checking again failed: {exc})"
            return False
        self._note(time.perf_counter() - t0, 0, ok=True)
        if not same:
            self._last_error = self._stale
            return False
        with self._lock:
            self._stale = ""
        log.warning("%s: the server serves the version opened again; its tiles load again", self.name)
        return True

    def _with_retries(self, request: Callable[[], _T], deadline: float, size: Callable[[_T], int]) -> _T:
        """`request()` until it succeeds, a permanent failure, the retries or the deadline.

        Transient failures wait a doubling, jittered backoff, or the server's Retry-After when that is
        longer; a closed connection (a keep-alive connection the server dropped) is retried at once,
        once, without using up a retry. Raises the last failure.
        """
        cfg = self.config
        attempt = 0
        reconnected = False
        while True:
            t0 = time.perf_counter()
            try:
                with self._in_flight:  # at most max_requests at once, whichever thread asks
                    result = request()
            except (PermanentError, PackChangedError):
                self._note(time.perf_counter() - t0, 0, ok=False)
                raise
            except TransientError as exc:
                self._note(time.perf_counter() - t0, 0, ok=False)
                if exc.closed_connection and not reconnected:
                    reconnected, wait = True, 0.0
                elif attempt < cfg.retries:
                    wait = max(self._backoff(attempt), exc.retry_after or 0.0)
                    attempt += 1
                else:
                    self._give_up(exc)
                    raise
                left = deadline - time.monotonic()
                if wait >= left:
                    self._give_up(exc)
                    if exc.retry_after is not None and exc.retry_after >= left:
                        raise TransientError(
                            f"{exc}: the server asks to retry after {exc.retry_after:.0f} s, past this "
                            f"request's deadline",
                            exc.errnum,
                        ) from None
                    raise
                with self._lock:
                    self._retries += 1
                time.sleep(wait)
                continue
            self._note(time.perf_counter() - t0, size(result), ok=True)
            return result

    def _give_up(self, exc: TransientError) -> None:
        """A request failed for good: fail the next ones at once for a while when the server could not
        be reached (`offline_s`) or asked to wait (its Retry-After, at most `retry_after_cap_s`)."""
        cfg = self.config
        if exc.retry_after is not None:
            hold = min(exc.retry_after, cfg.retry_after_cap_s)
            reason = f"the server asked to wait {exc.retry_after:.0f} s ({exc})"
        elif exc.connection:
            hold, reason = cfg.offline_s, "the server was unreachable a moment ago (retrying shortly)"
        else:
            return
        with self._lock:
            self._offline_until = time.monotonic() + hold
            self._offline_errno = exc.errnum
            self._offline_reason = reason

    def _backoff(self, attempt: int) -> float:
        return self.config.backoff_s * (1 << attempt) * (0.5 + random.random() / 2)

    def _note(self, seconds: float, nbytes: int, ok: bool) -> None:
        with self._lock:
            self._requests += 1
            self._bytes += nbytes
            self._latency.append(seconds * 1e3)
            if ok:
                self._offline_until = 0.0
            else:
                self._failed += 1

    def _mark_changed(self, why: str) -> None:
        """The file is STALE: uncached ranges fail until the opened version is back (checked every
        `stale_recheck_s`) or the pack is opened again."""
        with self._lock:
            first = not self._stale
            if first:
                self._stale = why
                self._stale_check_at = time.monotonic() + self.config.stale_recheck_s
        if first:
            log.error(
                "%s: %s; its tiles fail until the server serves the version opened again, or it is reopened",
                self.name,
                why,
            )

    def _store(self, first_block: int, data: bytes) -> None:
        """Cache `data`, which starts at `first_block`."""
        if self._cache is not None:
            self._cache.put(self._pack_id, self._url_id, first_block, data)

    def forget(self, offsets: np.ndarray, sizes: np.ndarray) -> None:
        """Drop the cached blocks under these byte ranges (tiles that failed their checksum)."""
        if self._cache is None:
            return
        block = self.config.block_bytes
        lo = np.asarray(offsets, np.int64) // block
        hi = (np.asarray(offsets, np.int64) + np.asarray(sizes, np.int64) - 1) // block
        counts = np.maximum(hi - lo + 1, 0)
        self._cache.discard(self._pack_id, np.repeat(lo, counts) + _ramp(counts))

    def drop_cached(self) -> int:
        """Forget every cached block of this pack (its metadata read through the cache did not parse:
        the next reads fetch from the server); how many blocks were dropped."""
        if self._cache is None:
            return 0
        return self._cache.discard_pack(self._pack_id)

    def check_version(self) -> bool:
        """Ask the server whether the pack is still the version opened (after a checksum failure:
        object stores give no per-request check). False marks it changed."""
        if self._stale:
            return not self._fail_at_once(time.monotonic() + self.config.request_deadline_s)
        try:
            same = self._transport.revalidate(self.version, time.monotonic() + self.config.request_deadline_s)
        except (TransientError, PermanentError):
            return True  # cannot tell now; the tile is retried later anyway
        if not same:
            self._mark_changed("the pack changed on the server")
        return same

    @property
    def changed(self) -> bool:
        """The pack changed on the server (STALE); False again once the opened version is back."""
        return bool(self._stale)

    def status(self) -> SourceStatus:
        """Whether this file's bytes can be read now: OK, OFFLINE or STALE, with why."""
        with self._lock:
            if self._stale:
                return SourceStatus(SourceState.STALE, self._stale)
            if time.monotonic() < self._offline_until:
                return SourceStatus(SourceState.OFFLINE, self._offline_reason)
        return SOURCE_OK

    @staticmethod
    def describe_error(err: int) -> str:
        if err == errno.ESTALE:
            return "the pack changed on the server since it was opened"
        import os

        return os.strerror(err)

    def stats(self) -> RemoteStats:
        cache = self._cache
        with self._lock:
            return RemoteStats(
                requests=self._requests,
                failed_requests=self._failed,
                retries=self._retries,
                net_bytes=self._bytes,
                cache_hits=self._hits,
                cache_misses=self._misses,
                latency_ms=tuple(self._latency),
                offline=time.monotonic() < self._offline_until,
                cache=cache.stats() if cache is not None and cache.active else None,
            )


def _make_transport(url: str, config: RemoteConfig) -> Transport:
    """HTTP(S) through urllib3, anything else through fsspec."""
    if url.split("://", 1)[0].lower() in ("http", "https"):
        return HttpTransport(
            url,
            max_requests=config.max_requests,
            connect_timeout_s=config.connect_timeout_s,
            read_timeout_s=config.read_timeout_s,
            redirects=config.redirects,
        )
    return FsspecTransport(url, config.storage_options)


def _ramp(counts: np.ndarray) -> np.ndarray:
    """0..c-1 for each c in `counts`, concatenated."""
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total, dtype=np.int64) - starts


def open_remote(url: str, config: RemoteConfig | None = None) -> RemoteFile:
    """Open a pack by URL: one request now (its version and first bytes); RemoteError when it fails."""
    from ..config import RemoteConfig

    return RemoteFile(url, config or RemoteConfig())
