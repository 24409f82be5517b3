"""Host, Origin and Sec-Fetch-Site rules against browsers, shared by the proxy (server/guard.py) and the verifier.

A browser lets any page send requests to a loopback port. Without these rules a page could spend a
server's keys (CSRF) or, after rebinding its own name to its address, read the answers (DNS
rebinding). Clients that are not browsers send no Origin and are unaffected. A page's `<img src>`
sends no Origin either, only `Sec-Fetch-Site`: outside the OpenAI API, other sites' requests are
answered only when they carry a listed Origin. The rules are written out in ServerConfig's docstring.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from yarl import URL

from proxy.config.server import normal_origin
from proxy.errors import ForbiddenError

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
ANY = "*"
OTHER_SITES = frozenset({"cross-site", "same-site"})  # Sec-Fetch-Site of a page elsewhere (another port is same-site)


class Listener(Protocol):
    """What the rules read of a server: the address it is bound to, and the Hosts and Origins listed besides."""

    @property
    def host(self) -> str: ...

    @property
    def allowed_hosts(self) -> tuple[str, ...]: ...

    @property
    def allowed_origins(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Bound:
    """A Listener from command-line options (the verifier's): the address bound, the Host names listed besides."""

    host: str
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _authority(host_header: str, scheme: str) -> tuple[str, int] | None:
    """(host, port) of a Host header, the port defaulted by `scheme`; None when it is not a host."""
    try:
        url = URL.build(scheme=scheme, authority=host_header)
        host, port = url.host, url.port
    except (ValueError, TypeError):
        return None
    return (host.lower().strip("[]"), port) if host and port is not None else None


def host_allowed(host_header: str | None, server: Listener) -> bool:
    """Whether a request naming `host_header` may reach the API (a missing Host is no browser's)."""
    if host_header is None:
        return True
    found = _authority(host_header, "http")
    if found is None:
        return False
    name = found[0]
    address = _address(name)
    if name == "localhost" or (address is not None and address.is_loopback):
        return True
    if ANY in server.allowed_hosts or name in server.allowed_hosts:
        return True
    bind = server.host.lower().strip("[]")
    if bind in WILDCARD_HOSTS:
        # A network served on purpose: every name until the names are listed; addresses always.
        return not server.allowed_hosts or address is not None
    return name == bind or (address is not None and address == _address(bind))


def same_origin(origin: str, host_header: str | None) -> bool:
    """Whether `origin` is the server's own, as the client reached it (scheme aside: a TLS front may add one)."""
    normal = normal_origin(origin)
    if normal is None or host_header is None:
        return False
    scheme = normal.split(":", 1)[0]
    return _authority(host_header, scheme) == _authority(normal.split("://", 1)[1], scheme)


def origin_allowed(origin: str | None, host_header: str | None, server: Listener) -> bool:
    """Whether a request from `origin` may reach the API (no Origin: not a browser)."""
    if origin is None or same_origin(origin, host_header):
        return True
    listed = server.allowed_origins
    return ANY in listed or (normal_origin(origin) or origin.strip().lower()) in listed


def refuse_foreign(headers: Mapping[str, str], server: Listener, *, api: bool, hint: str = "") -> str | None:
    """Raise ForbiddenError for a foreign Host, an unlisted cross-site Origin, or, outside the `api`, another site's
    request without a listed Origin (`hint` ends each message); return the listed cross-site Origin, if any."""
    host, origin = headers.get("Host"), headers.get("Origin")
    if not host_allowed(host, server):
        raise ForbiddenError(f"Host {host!r} is not an address of this server{hint}")
    if not origin_allowed(origin, host, server):
        raise ForbiddenError(f"cross-site requests from {origin!r} are refused{hint}")
    if origin is not None and not same_origin(origin, host):
        return origin
    site = headers.get("Sec-Fetch-Site", "")
    if site.lower() in OTHER_SITES and not api:
        raise ForbiddenError(f"this path answers pages of this server's own origin only (Sec-Fetch-Site: {site}){hint}")
    return None
