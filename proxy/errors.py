"""The error tree; each error knows its HTTP status and OpenAI error type.

    SpeculoosError
    ├── ClientError (4xx: the request is wrong)
    │   ├── BadRequestError          400 invalid_request_error
    │   │   └── ContextOverflowError 400 (prompt + max_tokens exceed the context)
    │   ├── NotFoundError            404 (unknown model or route)
    │   └── PayloadTooLargeError     413
    └── UpstreamError (5xx: the server behind us failed)
        ├── UpstreamUnavailableError 502 (refused, reset, garbage)
        └── UpstreamTimeoutError     504 (no bytes within the configured timeout)

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

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_body(self) -> dict[str, Any]:
        """The OpenAI error JSON body."""
        return error_body(self.message, self.error_type, self.status, param=self.param, code=self.code)


class ClientError(SpeculoosError):
    """The request is wrong."""

    status = 400
    error_type = "invalid_request_error"


class BadRequestError(ClientError):
    """Malformed or invalid request."""


class ContextOverflowError(BadRequestError):
    """The prompt (plus the tokens asked for) does not fit the model's context."""

    code = "context_length_exceeded"


class NotFoundError(ClientError):
    """Unknown model or route."""

    status = 404
    code = "model_not_found"


class PayloadTooLargeError(ClientError):
    """The request body is over the configured limit."""

    status = 413


class UpstreamError(SpeculoosError):
    """The server behind the proxy failed."""

    status = 502
    error_type = "upstream_error"


class UpstreamUnavailableError(UpstreamError):
    """Refused, reset or unreadable answer from the upstream."""


class UpstreamTimeoutError(UpstreamError):
    """The upstream sent nothing within the configured timeout."""

    status = 504
    error_type = "timeout"


def error_body(
    message: str, error_type: str, status: int, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape: {"error": {message, type, param, code}}."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code or status}}
