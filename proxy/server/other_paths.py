"""Every other path a route forwards (proxy.server.paths), untouched, to its upstream; anything else is a 404."""

from __future__ import annotations

import json

from aiohttp import web

from proxy.server import paths
from proxy.server.handlers import MODE_HEADER, PASSTHROUGH
from proxy.server.in_flight import read_body
from proxy.server.passthrough import forward
from proxy.server.runtime import CONFIG, runtime_for
from proxy.wire.json_body import parse_body


async def passthrough_any(request: web.Request) -> web.StreamResponse:
    """Any method on a path some route forwards: to the route of the body's `model`, if that route forwards it."""
    if not any(paths.forwards(route, request.path) for route in request.app[CONFIG].routes):
        raise paths.not_forwarded(request.method, request.path)  # refused before its body is read
    model = None
    if request.can_read_body and request.content_type == "application/json":
        try:
            body = await parse_body(await read_body(request), json.loads)
            model = body.get("model") if isinstance(body, dict) else None
        except (ValueError, RecursionError):  # not JSON, a number too long, nesting too deep
            model = None  # not ours to judge: the upstream answers malformed bodies itself
    runtime = runtime_for(request, model if isinstance(model, str) else None)
    if not paths.forwards(runtime.route, request.path):
        raise paths.not_forwarded(request.method, request.path)
    return await forward(request, runtime.upstream, extra_headers={MODE_HEADER: PASSTHROUGH})
