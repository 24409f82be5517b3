"""A cap on the requests the proxy holds at once: past it, a new one is a 503 with Retry-After, before its body
is read (each body becomes Python objects many times its size, and each request may hold a draft sequence)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from proxy.errors import OverloadedError
from proxy.wire.errors import Handler

RETRY_AFTER_S = 1  # requests finish in seconds: a client may try again soon


def in_flight_limit(limit: int) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """A middleware that answers 503 while `limit` requests are in flight."""
    in_flight = 0

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal in_flight
        if in_flight >= limit:
            raise OverloadedError(f"the proxy holds {limit} requests already (server.max_in_flight)",
                                  retry_after_s=RETRY_AFTER_S)
        in_flight += 1
        try:
            return await handler(request)
        finally:
            in_flight -= 1

    return middleware
