"""Where a redirect may lead: the redirect policy's checks, and which addresses are public.

`redirect_refusal(source, target, policy)` says why a redirect from `source` to `target` is refused
(None when it may be followed): another scheme, host or port than `RedirectPolicy` allows, or any
move from a public address to a loopback, private, link-local or reserved one (a server must not
steer requests at the user's own network). `address_scope` classifies one address; the resolver is
a parameter, so the checks are tested with fake resolutions, never by contacting an address.
"""

from __future__ import annotations

import enum
import ipaddress
import socket
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import first_line

if TYPE_CHECKING:
    from ..config import RedirectPolicy

__all__ = ["AddressScope", "Resolver", "address_scope", "redirect_refusal", "resolve_host"]


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
        return f"its host cannot be checked ({first_line(exc)[:200]})"
    if not scopes:
        return "its host resolves to no address"
    inner = sorted(s.value for s in scopes if s is not AddressScope.PUBLIC)
    if from_public and inner:
        return f"a public server redirecting to a {inner[0]} address"
    return None


# ---- HTTP ---------------------------------------------------------------------------------------------
