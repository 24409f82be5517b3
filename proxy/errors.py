"""The error tree; each error knows its HTTP status and OpenAI error type.

    SpeculoosError
    ├── ClientError (4xx: the request is wrong)
    │   ├── BadRequestError          400 invalid_request_error
    │   │   └── ContextOverflowError 400 (prompt + max_tokens exceed the context)
    │   ├── UnauthorizedError        401 (a missing or wrong API key: the verifier's --api-key)
    │   ├── ForbiddenError           403 (a browser request from a foreign Host or Origin)
    │   ├── NotFoundError            404 (unknown model or route)
    │   │   └── PathNotFoundError    404 (a path the proxy does not forward)
    │   ├── PayloadTooLargeError     413
    │   └── UnsupportedMediaError    415 (a POST body not sent as application/json: the verifier)
    ├── OverloadedError              503 (every slot busy and the queue full; Retry-After)
    └── UpstreamError (5xx: the server behind us failed)
        ├── UpstreamUnavailableError 502 (refused, reset, garbage)
        ├── UpstreamTimeoutError     504 (no bytes within the configured timeout)
        └── UpstreamBusyError        503 (every pooled connection to it stayed busy; Retry-After)

Library errors are translated where they happen; one middleware renders every error as
OpenAI error JSON, so no traceback ever reaches a client.
"""

from __future__ import annotations

from typing import Any


class SpeculoosError(Exception):
    """Base of every error we render to a client."""

    status = 500
    error_type = "internal_error"
    code: str | None = None
    retry_after_s: int | None = None  # a 503 says when to come back: the OpenAI SDK waits that long before retrying

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_body(self) -> dict[str, Any]:
        """The OpenAI error JSON body."""
        return error_body(self.message, self.error_type, self.status, param=self.param, code=self.code)

    def headers(self) -> dict[str, str]:
        """HTTP headers the error response carries besides its body: Retry-After, in whole seconds, where set."""
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


class ClientError(SpeculoosError):
    """The request is wrong."""

    status = 400
    error_type = "invalid_request_error"


class BadRequestError(ClientError):
    """Malformed or invalid request."""


class ContextOverflowError(BadRequestError):
    """The prompt (plus the tokens asked for) does not fit the model's context."""

    code = "context_length_exceeded"


class UnauthorizedError(ClientError):
    """The request carries no API key, or not the one asked for."""

    status = 401
    code = "invalid_api_key"

    def headers(self) -> dict[str, str]:
        """The scheme the key is asked for in (RFC 9110 §11.6.1)."""
        return {"WWW-Authenticate": "Bearer"}


class ForbiddenError(ClientError):
    """A request the proxy refuses to serve whatever its body (a foreign Host or a cross-site Origin)."""

    status = 403
    error_type = "permission_error"


class NotFoundError(ClientError):
    """Unknown model or route."""

    status = 404
    code = "model_not_found"


class PathNotFoundError(NotFoundError):
    """A path the proxy neither serves nor forwards."""

    code = None


class PayloadTooLargeError(ClientError):
    """The request body is over the configured limit."""

    status = 413


class UnsupportedMediaError(ClientError):
    """A request body in a media type other than JSON."""

    status = 415


class OverloadedError(SpeculoosError):
    """Every slot is busy and the queue of waiters is full: the client should come back later."""

    status = 503
    error_type = "server_error"
    code = "server_overloaded"
    retry_after_s = 1  # requests finish in seconds: a client may try again soon


class UpstreamError(SpeculoosError):
    """The server behind the proxy failed."""

    status = 502
    error_type = "upstream_error"


class UpstreamUnavailableError(UpstreamError):
    """Refused, reset or unreadable answer from the upstream."""

    code = "upstream_unavailable"  # the codes tell a client which of the upstream's failures it met


class UpstreamTimeoutError(UpstreamError):
    """The upstream sent nothing within the configured timeout."""

    status = 504
    error_type = "timeout"
    code = "upstream_timeout"


class UpstreamBusyError(UpstreamError):
    """Every connection of the route's pool stayed busy for the configured wait: the upstream is not at fault."""

    status = 503
    code = "upstream_busy"
    retry_after_s = 1  # a connection frees once a request ends


def error_body(
    message: str, error_type: str, status: int, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape: {"error": {message, type, param, code}}."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code or status}}
