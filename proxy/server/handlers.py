"""Chat and completions, one pipeline: read -> route -> admit -> serve (speculatively or passed through) -> log.

Each generation request is routed, then served in one of two modes (one structured log event says which, and why):
- speculative: prompt ids from the upstream's /tokenize, rounds of draft + verify, the answer written by the proxy
  (continued by plain decoding on the target if speculation stops paying mid-stream): speculate.py;
- passthrough: the original request forwarded untouched: passthrough.py.
Other paths: other_paths.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Any

import structlog
from aiohttp import ClientConnectionResetError, web

from proxy.control.route import PASSTHROUGH, SPECULATIVE
from proxy.server import live
from proxy.server.admit import Admitted, admit, route_request
from proxy.server.in_flight import read_body
from proxy.server.passthrough import pass_through, upstream_body
from proxy.server.runtime import METRICS
from proxy.server.speculate import serve_speculatively
from proxy.wire.request import CHAT, COMPLETION

log = structlog.get_logger("speculoos.request")

MODE_HEADER = "X-Speculoos-Mode"


@dataclass
class RequestSummary:
    """One generation request's log event: how it was served and how it ended."""

    kind: str
    stream: bool
    mode: str | None = None
    reason: str | None = None  # why it passed through
    status: int | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)  # a speculative generation's RequestStats

    def fields(self) -> dict[str, Any]:
        """The event's fields: those known, then the stats."""
        known = {item.name: getattr(self, item.name) for item in fields(self) if item.name != "stats"}
        return {**{name: value for name, value in known.items() if value is not None}, **self.stats}


async def _generation(request: web.Request, kind: str) -> web.StreamResponse:
    started = time.perf_counter()
    raw = await read_body(request)
    routed = await route_request(request, kind, raw)
    runtime, request_id = routed.runtime, uuid.uuid4().hex[:12]
    structlog.contextvars.bind_contextvars(request_id=request_id, route=runtime.name)
    summary = RequestSummary(kind, routed.stream)
    with live.watched(request, request_id, runtime.name, kind, routed.body, routed.tenant, summary.fields):
        try:
            admitted = await admit(routed, request_id)
            if isinstance(admitted, Admitted):
                summary.mode = SPECULATIVE
                response, outcome, stats = await serve_speculatively(request, runtime, admitted, request_id, started,
                                                                     {MODE_HEADER: SPECULATIVE})
                summary.prompt_tokens, summary.completion_tokens = outcome.prompt_tokens, outcome.completion_tokens
                summary.finish_reason, summary.stats = outcome.finish_reason, stats.as_dict()
                summary.error = outcome.error  # a stream ended in-band: the status says 200, this says why it stopped
            else:
                summary.mode, summary.reason = PASSTHROUGH, admitted
                meter = live.passthrough_meter(request)
                response, summary.completion_tokens = await pass_through(
                    request, runtime, upstream_body(routed.raw, routed.body, runtime.route), meter, started,
                    {MODE_HEADER: PASSTHROUGH})
            summary.status = response.status
            request.app[METRICS].requests.labels(runtime.name, summary.mode).inc()
            return response
        except (asyncio.CancelledError, ClientConnectionResetError):  # gone mid-request, or mid-answer as written
            summary.status, summary.error = 499, "client disconnected"  # nginx's code for it
            raise
        except Exception as exc:
            summary.status, summary.error = getattr(exc, "status", 500), type(exc).__name__
            raise
        finally:
            log.info("request", ms=round((time.perf_counter() - started) * 1000, 1), **summary.fields())
            structlog.contextvars.clear_contextvars()


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _generation(request, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _generation(request, COMPLETION)
