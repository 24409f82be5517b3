"""One middleware that renders every error as OpenAI error JSON; no traceback reaches a client.

Once an SSE response's head is out (`stream_opened`), no error can have a status line of its own:
whatever is raised ends the stream with an OpenAI error event and `data: [DONE]` instead
(`end_stream`), and a non-SSE response already partly sent is cut off rather than followed by a
second response inside its body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from proxy.errors import SpeculoosError, error_body
from proxy.wire.response import SSE_DONE, sse_event

log = structlog.get_logger("speculoos.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
INTERNAL_MESSAGE = "internal error in speculoos (see the server log)"
SSE_STREAM = web.RequestKey("sse_stream", web.StreamResponse)  # the request's SSE response, once its head is out
SSE_ENDED = web.RequestKey("sse_ended", bool)  # set once that stream's [DONE] is out


def _answer(request: web.Request, exc: Exception) -> tuple[int, dict, dict[str, str]]:
    """Status, OpenAI error body and headers for an exception (a bug of ours is logged with its traceback)."""
    if isinstance(exc, SpeculoosError):
        return exc.status, exc.to_body(), exc.headers()
    if isinstance(exc, web.HTTPException):
        error_type = "invalid_request_error" if exc.status < 500 else "internal_error"
        return exc.status, error_body(exc.reason, error_type, exc.status), {}
    log.error("unhandled_error", path=request.path, exc_info=exc)
    return 500, error_body(INTERNAL_MESSAGE, "internal_error", 500), {}


def stream_opened(request: web.Request, response: web.StreamResponse) -> None:
    """Remember that this request's SSE head is out: from now on errors go in-band."""
    request[SSE_STREAM] = response


def sse_stream(request: web.Request) -> web.StreamResponse | None:
    """The request's SSE response once its head is out, else None."""
    return request.get(SSE_STREAM)


async def end_stream(request: web.Request, exc: Exception | None = None) -> None:
    """End the request's open SSE stream: an error event for `exc` when given, then [DONE] (once)."""
    if request.get(SSE_ENDED):
        if exc is not None:  # the client has its whole answer; the error is ours to read in the log
            log.error("error_after_stream_end", path=request.path, exc_info=exc)
        return
    response = request[SSE_STREAM]
    if exc is not None:
        await response.write(sse_event(_answer(request, exc)[1]))
    await response.write(SSE_DONE)
    request[SSE_ENDED] = True


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Translate our errors, aiohttp's HTTP errors and anything unexpected into OpenAI error JSON."""
    try:
        return await handler(request)
    except Exception as exc:
        if isinstance(exc, ConnectionError) or (isinstance(exc, web.HTTPException) and exc.status < 400):
            raise  # the client went away (nothing to answer), or a redirect
        if SSE_STREAM in request:
            await end_stream(request, exc)
            return request[SSE_STREAM]
        if request.writer.output_size > 0:
            log.error("error_after_response_start", path=request.path, exc_info=exc)
            raise  # part of an answer we cannot add to is out: aiohttp drops the connection
        status, body, headers = _answer(request, exc)
        return web.json_response(body, status=status, headers=headers)
