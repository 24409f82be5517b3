"""Who may call the proxy: no dot segments, the browser rules (proxy/wire/browsers.py), CORS for listed origins.

The rules keep a web page from spending the routes' API keys or reading answers by DNS rebinding;
they are written out in ServerConfig's docstring. The live page keeps its own, stricter Host rule.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from proxy.errors import BadRequestError
from proxy.server.live import EVENTS_PATH, PAGE_PATH
from proxy.server.paths import is_api_path
from proxy.server.runtime import CONFIG
from proxy.targets.upstream import has_dot_segment
from proxy.wire.browsers import refuse_foreign, same_origin
from proxy.wire.errors import Handler

LIVE_PATHS = frozenset({PAGE_PATH, EVENTS_PATH})  # their own Host rule answers 404 (the page's existence stays unseen)
HINT = " (server.allowed_hosts and server.allowed_origins list those allowed)"
PREFLIGHT_MAX_AGE_S = "600"
CORS_ORIGIN = web.RequestKey("cors_origin", str)


@web.middleware
async def browser_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse dot segments, foreign Hosts and other sites' requests; answer listed origins' preflights and mark them
    for CORS."""
    if has_dot_segment(request.rel_url.raw_path):  # refused before any handler or rule reads the path
        raise BadRequestError("the request path must not have '.' or '..' segments")
    host, origin = request.headers.get("Host"), request.headers.get("Origin")
    if request.path in LIVE_PATHS and request.method in ("GET", "HEAD"):
        if origin is not None and not same_origin(origin, host):
            raise web.HTTPNotFound()  # the page talks to its own origin only, whatever is listed
        return await handler(request)
    listed = refuse_foreign(request.headers, request.app[CONFIG].server, api=is_api_path(request.path), hint=HINT)
    if listed is None:
        return await handler(request)
    request[CORS_ORIGIN] = listed
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

