"""Byte-range transports: HTTP(S) range requests (urllib3) and any fsspec filesystem.

A transport answers two questions: what is the file now (`probe`: its size and version, plus its
first bytes), and what are the bytes of one range of the version seen at the probe (`fetch`). It
neither retries nor caches (`RemoteFile` does both); it classifies every failure:

- `TransientError`: worth retrying (connection refused, reset or closed, timeouts, HTTP 408/425/429
  and 5xx), with the server's Retry-After when it sent one;
- `PermanentError`: retrying will not help (HTTP 404/403, a server that ignores ranges, a refused
  redirect);
- `PackChangedError`: the file is no longer the version probed (ETag, Last-Modified or size
  differ; HTTP 412 to the If-Match the request carried).

Nothing a server sends is trusted: a response must be 206 with the exact Content-Range asked for,
its body is read in bounded chunks up to the requested length and no further, and a response that
trickles past the request's deadline is cut. Redirects are followed here, hop by hop, only where
`RedirectPolicy` allows (`redirect_refusal`), and never from a public address to a loopback,
private or link-local one; urllib3 itself neither redirects nor retries.
"""

from __future__ import annotations

import datetime
import email.utils
import enum
import errno
import http.client
import ipaddress
import re
import socket
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import EngineError, first_line

if TYPE_CHECKING:
    from ..config import RedirectPolicy

__all__ = [
    "AddressScope",
    "FsspecTransport",
    "HttpTransport",
    "PackChangedError",
    "PermanentError",
    "RemoteError",
    "RemoteVersion",
    "TransientError",
    "Transport",
    "address_scope",
    "parse_content_length",
    "parse_content_range",
    "redact",
    "redirect_refusal",
    "resolve_host",
    "retry_after_seconds",
]

READ_CHUNK = 256 << 10  # bytes read from a response at a time (the deadline is checked between reads)
MAX_REDIRECTS = 5  # hops followed for one request
DRAIN_BYTES = 4096  # a body left unread up to this long is read, so its connection is kept
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_CONTENT_RANGE = re.compile(r"bytes (\d{1,18})-(\d{1,18})/(\d{1,18})", re.ASCII)  # digits as parse_content_length takes
_DELAY_SECONDS = re.compile(r"\d{1,12}", re.ASCII)


class RemoteError(EngineError):
    """A pack named by a URL cannot be reached or read (the message names the URL, without secrets)."""


class PackChangedError(RemoteError):
    """The pack on the server is not the version that was opened; reopen it to see the new one."""


class TransientError(Exception):
    """A failure worth retrying; `errnum` is the errno reported for the tiles it fails.

    Parameters
    ----------
    message : str
    errnum : int
    connection : bool
        The server could not be reached at all (refused, unreachable, connect timeout).
    closed_connection : bool
        The server closed or reset the connection before answering: most often a keep-alive
        connection it had dropped while idle, which a new connection fixes at once.
    retry_after : float or None
        Seconds the server asked to wait before the next try (its Retry-After), if it said.
    """

    def __init__(
        self,
        message: str,
        errnum: int = errno.EIO,
        connection: bool = False,
        *,
        closed_connection: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.errnum = errnum
        self.connection = connection
        self.closed_connection = closed_connection
        self.retry_after = retry_after


class PermanentError(Exception):
    """A failure retrying cannot fix."""

    def __init__(self, message: str, errnum: int = errno.EIO) -> None:
        super().__init__(message)
        self.errnum = errnum


@dataclass(frozen=True)
class RemoteVersion:
    """What identifies one version of a remote file."""

    size: int
    etag: str | None = None
    last_modified: str | None = None

    def key(self) -> str:
        return f"{self.size}\0{self.etag or ''}\0{self.last_modified or ''}"

    def describe(self) -> str:
        parts = [f"{self.size} bytes"]
        if self.etag:
            parts.append(f"ETag {self.etag}")
        if self.last_modified:
            parts.append(f"modified {self.last_modified}")
        return ", ".join(parts)


class Transport(Protocol):
    name: str

    def probe(self, length: int, deadline: float) -> tuple[RemoteVersion, bytes]: ...

    def fetch(self, start: int, length: int, version: RemoteVersion, deadline: float) -> bytes: ...

    def revalidate(self, version: RemoteVersion, deadline: float) -> bool: ...

    def close(self) -> None: ...


def redact(url: str) -> str:
    """The URL without credentials or query string (presigned URLs carry secrets there)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def retry_after_seconds(value: str | None, now: datetime.datetime | None = None) -> float | None:
    """Seconds a Retry-After header asks to wait: delay-seconds or an HTTP date (a past date: 0).

    None when there is no header or it does not parse (the caller's own backoff applies then).
    """
    if value is None:
        return None
    text = value.strip()
    if _DELAY_SECONDS.fullmatch(text):
        return float(int(text))
    if len(text) > 64:
        return None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT
        when = when.replace(tzinfo=datetime.UTC)
    now = now or datetime.datetime.now(datetime.UTC)
    return max(0.0, (when - now).total_seconds())


class AddressScope(enum.Enum):
    """Where an IP address lies: only PUBLIC ones are reachable from anywhere on the internet."""

    PUBLIC = "public"
    PRIVATE = "private"  # RFC 1918, unique-local and other site-private ranges
    LOOPBACK = "loopback"
    LINK_LOCAL = "link-local"  # 169.254/16 (cloud metadata services), fe80::/10
    RESERVED = "reserved"  # unspecified, multicast, shared (carrier NAT) and reserved ranges


def address_scope(address: str) -> AddressScope:
    """The scope of one IPv4 or IPv6 address (an IPv4-mapped IPv6 address counts as its IPv4 one).

    Raises
    ------
    ValueError
        `address` is not an IP address.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone ("fe80::1%eth0") names no scope
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return AddressScope.LOOPBACK
    if ip.is_link_local:
        return AddressScope.LINK_LOCAL
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return AddressScope.RESERVED
    if ip.is_global:
        return AddressScope.PUBLIC
    if ip.is_private:
        return AddressScope.PRIVATE
    return AddressScope.RESERVED


Resolver = Callable[[str], Sequence[str]]


def resolve_host(host: str) -> list[str]:
    """The addresses `host` resolves to (an IP literal: itself); OSError when it does not resolve."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    return sorted({info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})


@dataclass(frozen=True)
class _Origin:
    scheme: str
    host: str  # lower case, IPv6 without brackets
    port: int  # the scheme's default when the URL names none

    @staticmethod
    def of(url: str) -> _Origin:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        port = parts.port  # ValueError for a port out of range
        default = {"http": 80, "https": 443}.get(scheme, 0)
        return _Origin(scheme, (parts.hostname or "").rstrip("."), port if port is not None else default)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _same_site(a: str, b: str) -> bool:
    """The same host, or one a subdomain of the other (``example.com`` and ``cdn.example.com``).

    Without the public suffix list, sibling subdomains (``a.example.com``, ``b.example.com``) are not
    treated as one site: ``a.github.io`` and ``b.github.io`` belong to different owners.
    """
    if a == b:
        return True
    if _is_ip(a) or _is_ip(b):
        return False
    short, long = sorted((a, b), key=len)
    return short.count(".") >= 1 and long.endswith("." + short)


def redirect_refusal(source: str, target: str, policy: RedirectPolicy, resolve: Resolver = resolve_host) -> str | None:
    """Why a redirect from `source` to `target` must not be followed, or None to follow it.

    Pure apart from `resolve` (host name -> addresses), which is asked only when the host changes:
    a public server may not send requests to a loopback, private or link-local address.

    Parameters
    ----------
    source : str
        The URL the redirect answered.
    target : str
        Where it points (absolute: resolve a relative Location against `source` first).
    policy : RedirectPolicy
    resolve : callable
        Host name to its addresses; `resolve_host` (the system resolver) by default.
    """
    from ..config import RedirectPolicy  # config imports the pack layer, which imports this module

    try:
        src, dst = _Origin.of(source), _Origin.of(target)
    except ValueError:
        return "its address does not parse"
    if dst.scheme not in ("http", "https"):
        return f"another scheme ({dst.scheme or 'none'})"
    if not dst.host:
        return "it names no host"
    if policy is RedirectPolicy.NONE:
        return "redirects are not followed (RemoteConfig.redirects is none)"
    if src == dst:
        return None
    if policy is RedirectPolicy.SAME_ORIGIN:
        what = "scheme" if src.scheme != dst.scheme else "host" if src.host != dst.host else "port"
        return f"another {what} (RemoteConfig.redirects allows the same origin only)"
    if src.scheme == "https" and dst.scheme == "http":
        return "a downgrade from https to http"
    if not _same_site(src.host, dst.host):
        return "another site (RemoteConfig.redirects allows the same site only)"
    if src.host == dst.host:
        return None
    try:
        from_public = any(address_scope(a) is AddressScope.PUBLIC for a in resolve(src.host))
        scopes = {address_scope(a) for a in resolve(dst.host)}
    except (OSError, ValueError) as exc:
        return f"its host cannot be checked ({_message(exc)})"
    if not scopes:
        return "its host resolves to no address"
    inner = sorted(s.value for s in scopes if s is not AddressScope.PUBLIC)
    if from_public and inner:
        return f"a public server redirecting to a {inner[0]} address"
    return None


# ---- HTTP ---------------------------------------------------------------------------------------------
class HttpTransport:
    """HTTP(S) range requests over a urllib3 connection pool (thread-safe, keep-alive)."""

    def __init__(
        self,
        url: str,
        *,
        max_requests: int,
        connect_timeout_s: float,
        read_timeout_s: float,
        redirects: RedirectPolicy | None = None,
        resolve: Resolver = resolve_host,
        pool: Any = None,
    ) -> None:
        """`pool`: an object with urllib3.PoolManager's `request` and `clear` to send the requests
        through instead of a new PoolManager (the fuzz harness answers them without a network)."""
        import urllib3

        from ..config import RedirectPolicy
        from ..version import __version__

        self.url = url
        self.name = redact(url)
        self.redirects = redirects or RedirectPolicy.SAME_ORIGIN
        self._resolve = resolve
        self._urllib3 = urllib3
        self._pool = (
            pool
            if pool is not None
            else urllib3.PoolManager(
                num_pools=4,
                maxsize=max_requests,
                retries=False,  # RemoteFile retries; redirects are checked hop by hop in _request
                timeout=urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s),
                headers={"User-Agent": f"texstream/{__version__}", "Accept-Encoding": "identity"},
            )
        )

    def probe(self, length: int, deadline: float) -> tuple[RemoteVersion, bytes]:
        resp = self._request(0, length, None)
        try:
            if resp.status == 200:  # no range support; acceptable only for a file no longer than asked
                size = _content_length(resp)
                if size is None or size > length:
                    raise PermanentError("the server ignores Range requests (HTTP 200 instead of 206)")
                body = _read_body(resp, size, deadline)
                return self._version(resp, size), body
            self._check_status(resp)
            first, last, total = self._content_range(resp)
            if first != 0 or last != min(length, total) - 1:
                raise PermanentError(f"the server answered bytes {first}-{last} to a request for 0-{length - 1}")
            body = _read_body(resp, last + 1, deadline)
            return self._version(resp, total), body
        finally:
            _finish(resp)

    def fetch(self, start: int, length: int, version: RemoteVersion, deadline: float) -> bytes:
        resp = self._request(start, length, version)
        try:
            if resp.status == 200:
                raise PermanentError("the server ignores Range requests (HTTP 200 instead of 206)")
            self._check_status(resp)
            first, last, total = self._content_range(resp)
            seen = self._version(resp, total)
            if (
                total != version.size
                or _differs(seen.etag, version.etag)
                or (_differs(seen.last_modified, version.last_modified))
            ):
                raise PackChangedError(
                    f"the pack changed on the server ({seen.describe()}, opened as {version.describe()})"
                )
            if (first, last) != (start, start + length - 1):
                raise PermanentError(
                    f"the server answered bytes {first}-{last} to a request for {start}-{start + length - 1}"
                )
            return _read_body(resp, length, deadline)
        finally:
            _finish(resp)

    def revalidate(self, version: RemoteVersion, deadline: float) -> bool:
        """True when the file is still `version` (a one-byte request)."""
        try:
            self.fetch(0, 1, version, deadline)
        except PackChangedError:
            return False
        return True

    def _request(self, start: int, length: int, version: RemoteVersion | None) -> Any:
        """The response to a range GET, after the redirects the policy allows (each hop checked)."""
        headers = {"Range": f"bytes={start}-{start + length - 1}"}
        if version is not None:  # the server refuses (412) rather than serve another version's bytes
            if version.etag and not version.etag.startswith("W/"):
                headers["If-Match"] = version.etag
            elif version.last_modified:
                headers["If-Unmodified-Since"] = version.last_modified
        url = self.url
        for _ in range(MAX_REDIRECTS + 1):
            resp = self._send(url, headers)
            if resp.status not in REDIRECT_STATUSES:
                return resp
            location = resp.headers.get("Location")
            _finish(resp)
            if not location:
                raise PermanentError(f"HTTP {resp.status} redirect without a Location")
            target = urllib.parse.urljoin(url, location.strip())
            why = redirect_refusal(url, target, self.redirects, self._resolve)
            if why is not None:
                raise PermanentError(f"refused a redirect to {redact(target)}: {why}", errno.EPERM)
            url = target
        raise PermanentError(f"more than {MAX_REDIRECTS} redirects")

    def _send(self, url: str, headers: dict[str, str]) -> Any:
        """One GET, no redirect followed, every failure classified."""
        u3 = self._urllib3
        try:
            return self._pool.request(
                "GET", url, headers=headers, preload_content=False, decode_content=False, redirect=False
            )
        except u3.exceptions.LocationValueError as exc:
            raise PermanentError(f"bad URL {redact(url)}: {_message(exc)}") from None
        except u3.exceptions.ConnectTimeoutError as exc:  # NewConnectionError too: refused, unreachable
            raise _connection_error(exc) from None
        except u3.exceptions.TimeoutError:
            raise TransientError("the server did not answer in time", errno.ETIMEDOUT) from None
        except u3.exceptions.ProtocolError as exc:
            cause = exc.args[1] if len(exc.args) > 1 else exc.__context__
            if isinstance(cause, http.client.RemoteDisconnected):
                raise TransientError(
                    "the server closed the connection without answering", errno.ECONNRESET, closed_connection=True
                ) from None
            if isinstance(cause, ConnectionResetError | BrokenPipeError | ConnectionAbortedError):
                raise TransientError("the connection was reset", errno.ECONNRESET, closed_connection=True) from None
            raise TransientError(f"connection failed: {_message(exc)}", errno.ECONNRESET, connection=True) from None
        except (u3.exceptions.SSLError, u3.exceptions.HTTPError, OSError) as exc:
            raise TransientError(f"connection failed: {_message(exc)}", errno.ECONNRESET, connection=True) from None

    def _check_status(self, resp: Any) -> None:
        status = resp.status
        if status == 206:
            return
        if status == 412:
            raise PackChangedError("the pack changed on the server (HTTP 412 to If-Match)")
        if status == 416:
            raise PackChangedError("the pack on the server is shorter than when it was opened (HTTP 416)")
        if status in (408, 425, 429) or (500 <= status <= 599 and status not in (501, 505)):
            raise TransientError(
                f"HTTP {status} {resp.reason or ''}".rstrip(),
                errno.EAGAIN if status in (429, 503) else errno.EIO,
                retry_after=retry_after_seconds(resp.headers.get("Retry-After")),
            )
        if status == 404:
            raise PermanentError("not found on the server (HTTP 404)", errno.ENOENT)
        if status in (401, 403):
            raise PermanentError(f"access denied (HTTP {status})", errno.EACCES)
        raise PermanentError(f"unexpected HTTP {status} {resp.reason or ''}".rstrip())

    def _content_range(self, resp: Any) -> tuple[int, int, int]:
        return parse_content_range(resp.headers.get("Content-Range", ""), resp.headers.get("Content-Length"))

    @staticmethod
    def _version(resp: Any, size: int) -> RemoteVersion:
        return RemoteVersion(size, resp.headers.get("ETag"), resp.headers.get("Last-Modified"))

    def close(self) -> None:
        self._pool.clear()


def _differs(seen: str | None, opened: str | None) -> bool:
    """A validator the server sent now that differs from the one it sent at open."""
    return opened is not None and seen is not None and seen != opened


def _content_length(resp: Any) -> int | None:
    return parse_content_length(resp.headers.get("Content-Length"))


def parse_content_length(text: str | None) -> int | None:
    """The value of a Content-Length header (None when absent); PermanentError unless it is 1 to 18
    ASCII digits."""
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise PermanentError(f"bad Content-Length {text[:40]!r}")
    return int(text)


def parse_content_range(text: str, content_length: str | None = None) -> tuple[int, int, int]:
    """(first, last, total) of a ``Content-Range: bytes first-last/total`` header, checked against
    the response's Content-Length header when it has one; PermanentError for anything else."""
    m = _CONTENT_RANGE.fullmatch(text.strip())
    if m is None:
        raise PermanentError(f"bad Content-Range {text[:80]!r}")
    first, last, total = (int(v) for v in m.groups())
    if not first <= last < total:
        raise PermanentError(f"bad Content-Range {text[:80]!r}")
    length = parse_content_length(content_length)
    if length is not None and length != last - first + 1:
        raise PermanentError(f"Content-Length {length} does not match Content-Range {text[:80]!r}")
    return first, last, total


def _read_body(resp: Any, length: int, deadline: float) -> bytes:
    """Exactly `length` bytes of the body: fewer is an error, more is never read."""
    out = bytearray(length)
    view = memoryview(out)
    done = 0
    try:
        while done < length:
            if time.monotonic() > deadline:
                raise TransientError(
                    f"response too slow: {done} of {length} bytes before the deadline", errno.ETIMEDOUT
                )
            chunk = resp.read(min(READ_CHUNK, length - done))
            if not chunk:
                raise TransientError(f"response ended after {done} of {length} bytes", errno.EIO)
            view[done : done + len(chunk)] = chunk
            done += len(chunk)
        if _content_length(resp) is None and resp.read(1):
            raise PermanentError("the server sent more bytes than the range asked for")
    except (TransientError, PermanentError):
        raise
    except Exception as exc:  # noqa: BLE001 (urllib3 read errors: timeouts, resets, bad chunking)
        text = _message(exc)
        if "timed out" in text.lower():
            raise TransientError("the response stalled (read timed out)", errno.ETIMEDOUT) from None
        raise TransientError(f"reading the response failed: {text}", errno.EIO) from None
    return bytes(out)


def _finish(resp: Any) -> None:
    """Give the connection back once the body is read to its end (a short one, as error pages and
    redirects have, is read now), else drop it."""
    try:
        if not resp.isclosed():
            left = resp.length_remaining
            if left is not None and left <= DRAIN_BYTES:
                resp.drain_conn()  # the connection can carry the next request only after the whole body
            else:
                resp.close()  # unread bytes, or a body of unknown length
    finally:
        resp.release_conn()


def _connection_error(reason: BaseException) -> TransientError:
    text = _message(reason)
    if "timed out" in text.lower():
        return TransientError("cannot connect: timed out", errno.ETIMEDOUT, connection=True)
    if "refused" in text.lower():
        return TransientError("cannot connect: connection refused", errno.ECONNREFUSED, connection=True)
    return TransientError(f"cannot connect: {text}", errno.EHOSTUNREACH, connection=True)


def _message(exc: BaseException) -> str:
    text = first_line(exc)
    # urllib3 messages repeat the pool object's repr; keep the part after it
    if ": " in text and text.startswith("<"):
        text = text.split(": ", 1)[1]
    return text[:200]


# ---- fsspec -------------------------------------------------------------------------------------------
class FsspecTransport:
    """Any filesystem fsspec knows (s3://, gs://, az://, memory://, ...), its backend installed.

    Object stores give no per-request version check through fsspec, so the version (size, ETag or
    modification time) is read at open and read again whenever a tile fails its checksum.
    """

    def __init__(self, url: str, storage_options: dict) -> None:
        self.name = redact(url)
        try:
            import fsspec
        except ImportError:
            raise RemoteError(
                f"{self.name}: reading {url.split(':', 1)[0]}:// needs fsspec (pip install fsspec)"
            ) from None
        try:
            self._fs, self._path = fsspec.core.url_to_fs(url, **storage_options)
        except (ImportError, ValueError) as exc:  # e.g. "Install s3fs to access S3"
            raise RemoteError(f"{self.name}: {_message(exc)}") from None

    def _info(self) -> RemoteVersion:
        try:
            info = self._fs.info(self._path)
        except FileNotFoundError:
            raise PermanentError("not found", errno.ENOENT) from None
        except PermissionError:
            raise PermanentError("access denied", errno.EACCES) from None
        except Exception as exc:  # noqa: BLE001 (each backend raises its own network errors)
            raise TransientError(f"cannot stat: {_message(exc)}", errno.EIO, connection=True) from None
        if info.get("type") not in (None, "file"):
            raise PermanentError(f"is a {info.get('type')}, not a file", errno.EISDIR)
        size = info.get("size")
        if not isinstance(size, int) or size < 0:
            raise PermanentError(f"the filesystem reports no size ({size!r})")
        etag = info.get("ETag") or info.get("etag") or info.get("md5Hash")
        modified = next(
            (
                info[k]
                for k in ("LastModified", "last_modified", "mtime", "updated", "created")
                if info.get(k) is not None
            ),
            None,
        )
        return RemoteVersion(size, str(etag) if etag else None, str(modified) if modified is not None else None)

    def probe(self, length: int, deadline: float) -> tuple[RemoteVersion, bytes]:
        version = self._info()
        n = min(length, version.size)
        return version, self._cat(0, n) if n else b""

    def fetch(self, start: int, length: int, version: RemoteVersion, deadline: float) -> bytes:
        if start + length > version.size:
            raise PermanentError(f"range {start}+{length} is past the end ({version.size})")
        return self._cat(start, length)

    def _cat(self, start: int, length: int) -> bytes:
        try:
            data = self._fs.cat_file(self._path, start=start, end=start + length)
        except FileNotFoundError:
            raise PackChangedError("the pack is gone from the filesystem") from None
        except Exception as exc:  # noqa: BLE001
            raise TransientError(f"read failed: {_message(exc)}", errno.EIO, connection=True) from None
        if len(data) != length:
            raise PackChangedError(f"asked for {length} bytes at {start}, got {len(data)}: the pack changed?")
        return bytes(data)

    def revalidate(self, version: RemoteVersion, deadline: float) -> bool:
        try:
            return self._info() == version
        except PermanentError:
            return False

    def close(self) -> None:
        pass
