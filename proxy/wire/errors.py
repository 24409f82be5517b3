"""One middleware that renders every error as OpenAI error JSON; no traceback reaches a client."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from proxy.errors import SpeculoosError, error_body

log = structlog.get_logger("speculoos.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, message: str, error_type: str, *, param: str | None = None,
                   code: str | None = None) -> web.Response:
    """An OpenAI-shaped error response."""
    return web.json_response(error_body(message, error_type, status, param=param, code=code), status=status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Translate our errors, aiohttp's HTTP errors and anything unexpected into OpenAI error JSON."""
    try:
        return await handler(request)
    except SpeculoosError as exc:
        return web.json_response(exc.to_body(), status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error_type = "invalid_request_error" if exc.status < 500 else "internal_error"
        return error_response(exc.status, exc.reason, error_type)
    except (ConnectionResetError, ConnectionError):
        raise  # the client went away: nothing to answer
    except Exception:  # a bug of ours: log it with its traceback, answer a clean 500
        log.exception("unhandled_error", path=request.path)
        return error_response(500, "internal error in speculoos (see the server log)", "internal_error")
