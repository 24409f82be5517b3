"""GET /speculoos/live: a page of recent requests' tokens by origin and every route's decision, fed by SSE.

Off unless `server.live: true` (404 otherwise). The stream shows prompt and output text, so each reader
sees only its own API key's requests, and every tenant's only with the admin token (proxy/server/live_access.py
says who reads what, and where). The page itself holds no data: it asks for the key, or takes the token from
its URL's fragment, and passes it in a header to the stream, which it reads with fetch (an EventSource cannot
send headers). Neither the page nor its stream carries a key: only tokens, timings and decisions.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

from aiohttp import web

from proxy.control.route import PASSTHROUGH, SPECULATIVE
from proxy.decode.events import Subscriber
from proxy.observability.live import PASSTHROUGH as PASSTHROUGH_ORIGIN
from proxy.observability.live import LiveFeed, RoundTracker, Trace
from proxy.server.live_access import admin_token, page_address, reader, serves_live
from proxy.server.passthrough import TokenMeter
from proxy.server.runtime import CONFIG, RUNTIMES, RouteRuntime
from proxy.wire.response import SSE_HEADERS

PAGE_PATH, EVENTS_PATH = "/speculoos/live", "/speculoos/live/events"
ROUTES_EVERY_S = 1.0  # how often an open page gets the routes' state
OUTCOME_KEYS = ("mode", "reason", "status", "error", "finish_reason", "completion_tokens", "alpha", "rounds",
                "drafted", "accepted", "switched_to_plain")
PAGE_HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    "Cache-Control": "no-store",
    # Everything is inline and the page talks to its own origin only.
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; img-src data:; base-uri 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}

LIVE = web.AppKey("live", LiveFeed)
LIVE_TOKEN = web.AppKey("live_token", str)  # the admin token: every tenant's requests
PAGE = web.AppKey("live_page", bytes)
TRACE = web.RequestKey("live_trace", Trace)


def setup(app: web.Application) -> None:
    """Register the page and its stream (404 when off); with `server.live`, the feed handlers report to and the
    admin token, printed at start-up when generated."""
    app.router.add_get(PAGE_PATH, page)
    app.router.add_get(EVENTS_PATH, events)
    server = app[CONFIG].server
    if not server.live:
        return
    app[LIVE] = LiveFeed()
    app[PAGE] = resources.files("proxy.server").joinpath("live_page.html").read_bytes()
    app[LIVE_TOKEN], generated = admin_token(server)

    async def announce(app: web.Application) -> None:
        url = f"http://{page_address(server.host)}:{server.port}{PAGE_PATH}"
        every = f"{url}#token={app[LIVE_TOKEN]}" if generated else f"{url}#token=<server.live_token>"
        # Printed, never logged: the notebook servers' way, so the token reaches its owner's terminal only.
        print(f"speculoos: live page {url} (a key's own requests); every tenant's: {every}", flush=True)

    async def end_streams(app: web.Application) -> None:
        app[LIVE].close()

    app.on_startup.append(announce)
    app.on_shutdown.append(end_streams)


def _feed(request: web.Request) -> LiveFeed:
    """The feed, or a 404 when the view is off or asked for on another address."""
    feed = request.app.get(LIVE)
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    local = sockname[0] if isinstance(sockname, tuple) and sockname else None
    try:
        host_name = request.url.host
    except ValueError:  # a Host header that is not a host
        host_name = None
    if feed is None or not serves_live(local, host_name, request.app[CONFIG].server.host):
        raise web.HTTPNotFound()
    return feed


async def page(request: web.Request) -> web.Response:
    """GET /speculoos/live: the page (one self-contained HTML file)."""
    _feed(request)
    return web.Response(body=request.app[PAGE], headers=PAGE_HEADERS)


def _finite(value: Any) -> Any:
    """JSON for a browser: no NaN or infinity (JSON.parse rejects them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _route(runtime: RouteRuntime) -> dict[str, Any]:
    occupancy = runtime.drafter.occupancy() if runtime.drafter is not None else None
    draft = runtime.route.draft
    status = runtime.controller.status()
    if not runtime.speculates:  # the controller's state says nothing about a route that cannot speculate
        status.update(mode=PASSTHROUGH, k=0, reason="passthrough only (no draft or non-verifying protocol)")
    return _finite({
        "route": runtime.name, "protocol": runtime.route.upstream.protocol,
        "draft": None if draft is None else f"{draft.model} ({draft.kind})",
        "draft_sequences": None if occupancy is None else {"in_use": occupancy[0], "total": occupancy[1]},
        **status,
    })


def routes_message(app: web.Application) -> dict[str, Any]:
    """Every route's mode, α, K, costs, predicted rates and why."""
    return {"type": "routes", "now": time.time(), "routes": [_route(r) for r in app[RUNTIMES].values()]}


def _sse(data: str) -> bytes:
    return b"data: " + data.encode() + b"\n\n"


async def events(request: web.Request) -> web.StreamResponse:
    """GET /speculoos/live/events: a snapshot, then every event the reader may see, and the routes every second."""
    feed = _feed(request)
    subscription = feed.subscribe(reader(request.headers, request.app[LIVE_TOKEN]))  # before any byte: a 403 whole
    response = web.StreamResponse(headers=SSE_HEADERS)
    try:
        await response.prepare(request)
        await response.write(_sse(json.dumps(feed.snapshot(subscription.reader))))
        await response.write(_sse(json.dumps(routes_message(request.app))))
        routes_due = time.monotonic() + ROUTES_EVERY_S
        while True:
            try:
                data = await asyncio.wait_for(subscription.queue.get(), ROUTES_EVERY_S)
            except TimeoutError:
                data = ""  # nothing happened: time to show the routes again
            if data is None:
                break  # the proxy is shutting down
            if subscription.behind:
                data = json.dumps(feed.catch_up(subscription))  # the snapshot covers what was dropped
            if data:
                await response.write(_sse(data))
            if time.monotonic() >= routes_due:
                await response.write(_sse(json.dumps(routes_message(request.app))))
                routes_due = time.monotonic() + ROUTES_EVERY_S
    except ConnectionResetError:
        pass  # the page went away; its queue is freed below
    finally:
        feed.unsubscribe(subscription)
    return response


# -- what the generation handlers report ---------------------------------------------------------------


@contextmanager
def watched(request: web.Request, request_id: str, route: str, kind: str, body: dict[str, Any], tenant: str,
            outcome: Callable[[], dict[str, Any]]) -> Iterator[None]:
    """Show a routed generation request while it is served; `outcome` is its log event once it is over (only the
    outcome fields are shown)."""
    feed = request.app.get(LIVE)
    if feed is not None:
        request[TRACE] = feed.begin(request_id, route, kind, body, tenant=tenant)
    try:
        yield
    finally:
        if feed is not None and (trace := request.get(TRACE)) is not None:
            summary = outcome()
            feed.end(trace, _finite({k: summary[k] for k in OUTCOME_KEYS if k in summary}))


def round_subscribers(app: web.Application, request_id: str, runtime: RouteRuntime) -> list[Subscriber]:
    """The subscribers that show a speculative generation's events (none when the view is off)."""
    feed = app.get(LIVE)
    trace = feed.get(request_id) if feed is not None else None
    if feed is None or trace is None or runtime.drafter is None:
        return []
    feed.set_mode(trace, SPECULATIVE)
    return [RoundTracker(feed, trace, runtime.drafter.vocabulary.token_bytes)]


def passthrough_meter(request: web.Request) -> TokenMeter:
    """The meter of a passthrough answer; with the view on, it also shows the answer's text."""
    feed, trace = request.app.get(LIVE), request.get(TRACE)
    if feed is None or trace is None:
        return TokenMeter()
    feed.set_mode(trace, PASSTHROUGH)
    return LiveMeter(feed, trace)


class LiveMeter(TokenMeter):
    """A passthrough meter that also shows each answer's text as it is forwarded."""

    def __init__(self, feed: LiveFeed, trace: Trace) -> None:
        super().__init__()
        self._feed = feed
        self._trace = trace

    def _count(self, body: dict) -> None:
        super()._count(body)
        pieces = []
        for choice in body.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            for holder, key in ((choice.get("delta"), "content"), (choice, "text"), (choice.get("message"), "content")):
                if isinstance(holder, dict) and isinstance(holder.get(key), str) and holder[key]:
                    pieces.append((holder[key], PASSTHROUGH_ORIGIN))
        if pieces:
            self._feed.add_tokens(self._trace, pieces, None)
