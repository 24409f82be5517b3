"""What the proxy holds at once: a cap on requests (past it, a 503 with Retry-After before the body is read) and a
budget for the memory their JSON bodies take once parsed (each body becomes Python objects up to ~20 times its
size: `[[],[],…]` makes a list of 64 bytes from every 3)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from proxy.errors import OverloadedError, PayloadTooLargeError
from proxy.wire.errors import Handler

VALUE_BYTES = 64  # a small Python object (an empty list, a short string, an int) plus its slot in its container
TEXT_BYTES = 5  # a byte of text: its own copy, and up to 4 bytes a character once a string holds one astral char


def parsed_size_bound(body: bytes) -> int:
    """An upper estimate of the memory `json.loads(body)` takes, from a count of values made without parsing."""
    values = 1 + body.count(b",") + body.count(b"[") + body.count(b"{")
    return TEXT_BYTES * len(body) + VALUE_BYTES * values


@dataclass
class _Holding:
    """The requests in flight and the parsed-body bytes they hold."""

    requests: int = 0
    parsed_bytes: int = 0


# The request's own reserve(size): read_body calls it, the middleware gives the bytes back when the request ends.
RESERVE = web.RequestKey("speculoos_reserve", Callable[[int], None])


async def read_body(request: web.Request) -> bytes:
    """The request body, once its parsed size fits the budget of the middleware that admitted the request."""
    raw = await request.read()
    reserve = request.get(RESERVE)
    if reserve is not None:
        reserve(parsed_size_bound(raw))
    return raw


def in_flight_limit(limit: int, parsed_budget: int,
                    body_parsed_limit: int) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """A middleware that answers 503 while `limit` requests are in flight or their parsed bodies would pass
    `parsed_budget` bytes, and 413 for a body that alone would pass `body_parsed_limit` or the budget."""
    holding = _Holding()

    def reserver(reserved: list[int]) -> Callable[[int], None]:
        def reserve(size: int) -> None:
            if reserved:  # read twice: reserved once
                return
            for cap, name in ((body_parsed_limit, "max_body_parsed_bytes"), (parsed_budget, "max_parsed_bytes")):
                if size > cap:
                    raise PayloadTooLargeError(f"the request body would take about {size >> 20} MiB once parsed, "
                                               f"more than server.{name} ({cap >> 20} MiB)")
            if holding.parsed_bytes + size > parsed_budget:
                raise OverloadedError("the requests in flight hold their share of server.max_parsed_bytes")
            holding.parsed_bytes += size
            reserved.append(size)

        return reserve

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if holding.requests >= limit:
            raise OverloadedError(f"the proxy holds {limit} requests already (server.max_in_flight)")
        holding.requests += 1
        reserved: list[int] = []
        request[RESERVE] = reserver(reserved)
        try:
            return await handler(request)
        finally:
            holding.requests -= 1
            holding.parsed_bytes -= sum(reserved)

    return middleware
