"""Who may call the proxy: Host and Origin checks against browsers, CORS for listed origins, and the client's tenant.

A browser lets any page send requests to a loopback port. Without these checks a page could spend
the routes' API keys (CSRF) or, after rebinding its own name to our address, read the answers
(DNS rebinding). Clients that are not browsers send no Origin and are unaffected. The rules are
written out in ServerConfig's docstring; the live page keeps its own, stricter Host rule.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping

from aiohttp import web
from yarl import URL

from proxy.config.schema import ServerConfig, normal_origin
from proxy.errors import ForbiddenError
from proxy.server.runtime import CONFIG
from proxy.wire.errors import Handler

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
ANY = "*"
LIVE_PREFIX = "/speculoos/live"  # its own Host rule answers 404 (the page's existence stays unseen)
ANONYMOUS = ""  # the tenant of requests without a key
PREFLIGHT_MAX_AGE_S = "600"
CORS_ORIGIN = web.RequestKey("cors_origin", str)


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


def host_allowed(host_header: str | None, server: ServerConfig) -> bool:
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
    """Whether `origin` is the proxy's own, as the client reached it (scheme aside: a TLS front may add one)."""
    normal = normal_origin(origin)
    if normal is None or host_header is None:
        return False
    scheme = normal.split(":", 1)[0]
    return _authority(host_header, scheme) == _authority(normal.split("://", 1)[1], scheme)


def origin_allowed(origin: str | None, host_header: str | None, server: ServerConfig) -> bool:
    """Whether a request from `origin` may reach the API (no Origin: not a browser)."""
    if origin is None or same_origin(origin, host_header):
        return True
    listed = server.allowed_origins
    return ANY in listed or (normal_origin(origin) or origin.strip().lower()) in listed


@web.middleware
async def browser_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse foreign Hosts and cross-site Origins; answer listed origins' preflights and mark them for CORS."""
    server = request.app[CONFIG].server
    host, origin = request.headers.get("Host"), request.headers.get("Origin")
    if request.path == LIVE_PREFIX or request.path.startswith(LIVE_PREFIX + "/"):
        if origin is not None and not same_origin(origin, host):
            raise web.HTTPNotFound()  # the page talks to its own origin only, whatever is listed
        return await handler(request)
    if not host_allowed(host, server):
        raise ForbiddenError(f"Host {host!r} is not an address of this proxy (server.allowed_hosts lists others)")
    if not origin_allowed(origin, host, server):
        raise ForbiddenError(f"cross-site requests from {origin!r} are refused (server.allowed_origins lists those "
                             "allowed)")
    if origin is None or same_origin(origin, host):
        return await handler(request)
    request[CORS_ORIGIN] = origin
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        return web.Response(status=204, headers=_preflight_headers(request.headers))
    return await handler(request)


def _preflight_headers(headers: Mapping[str, str]) -> dict[str, str]:
    allowed = {"Access-Control-Allow-Methods": "GET, POST, OPTIONS", "Access-Control-Max-Age": PREFLIGHT_MAX_AGE_S}
    if "Access-Control-Request-Headers" in headers:
        allowed["Access-Control-Allow-Headers"] = headers["Access-Control-Request-Headers"]
    return allowed


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: a listed cross-site origin may read the answer (errors and streams included)."""
    origin = request.get(CORS_ORIGIN)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = "X-Speculoos-Mode"
        response.headers.add("Vary", "Origin")


def tenant(headers: Mapping[str, str]) -> str:
    """Whose outputs a request may draft from: a digest of the client's API key (never the key), or ANONYMOUS."""
    authorization = headers.get("Authorization")  # case-insensitive lookup
    if not authorization:
        return ANONYMOUS
    scheme, _, credentials = authorization.strip().partition(" ")
    key = credentials.strip() if scheme.lower() == "bearer" else authorization.strip()
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]
