"""One pooled HTTP client per upstream: a bounded pool, a timeout per phase, and aiohttp errors translated to ours.

A request goes through phases, each with its own limit and its own message when it runs out:
waiting for a free connection of the pool (`pool`), connecting (`connect`), the answer's head
(`first_byte`, counted from when a connection was had), then silence between body bytes (`idle`).
An answer the proxy reads whole (its own JSON calls) is also capped in size (`max_answer_bytes`) and
in time, head and body together (`total`): a trickle never silent for `idle` still ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import aiohttp
import structlog
from yarl import URL

from proxy.engine.gate import TARGET, CoreGate
from proxy.errors import (
    BadRequestError,
    UpstreamBusyError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from proxy.targets.body_reading import read_body
from proxy.targets.json_io import dumps, loads
from proxy.wire.keys import key_headers

log = structlog.get_logger("speculoos.upstream")

DEFAULT_CONNECTIONS = 100
# Idle pooled connections are closed after this long: under the 5 s keep-alive of uvicorn (vLLM, SGLang),
# so the proxy drops a connection before the server does and a request rarely meets one being closed.
KEEPALIVE_S = 4.0
# An answer the proxy reads whole (scoring, tokenizing, probing) is at most this large: the largest real ones, top-N
# log-probs over a long prompt, are a few MiB. Meant to become the route's upstream.max_answer_bytes.
MAX_ANSWER_BYTES = 64 << 20
# Such a call, head and body, ends within this: far past any scoring round. Meant to become the route's timeouts.total.
MAX_CALL_S = 600.0


@dataclass(frozen=True)
class Timeouts:
    """Seconds: to connect, to the first response byte, of silence between body bytes, for a free connection, and
    for the whole of a call whose answer the proxy reads whole."""

    connect: float = 5.0
    first_byte: float = 120.0
    idle: float = 60.0
    pool: float = 30.0
    total: float = MAX_CALL_S


class _Attempt:
    """One send's way through the pool, told by aiohttp's trace signals: they move its deadline phase by phase."""

    def __init__(self, timeouts: Timeouts) -> None:
        self.timeouts = timeouts
        self.deadline: asyncio.Timeout | None = None
        self.queued_since: float | None = None  # waiting for a free connection since (loop time)
        self.reused = False  # sent on a kept-alive connection

    def _move(self, when: float) -> None:
        if self.deadline is not None and not self.deadline.expired():
            self.deadline.reschedule(when)

    def queued(self) -> None:
        now = asyncio.get_running_loop().time()
        self.queued_since = self.queued_since if self.queued_since is not None else now
        self._move(self.queued_since + self.timeouts.pool)

    def dequeued(self) -> None:
        self.queued_since = None
        self._move(asyncio.get_running_loop().time() + self.timeouts.first_byte)


def _trace() -> aiohttp.TraceConfig:
    """Signals that tell each send's _Attempt (its trace_request_ctx) where it stands."""
    config = aiohttp.TraceConfig()

    async def queued(session: Any, context: Any, params: Any) -> None:
        context.trace_request_ctx.queued()

    async def dequeued(session: Any, context: Any, params: Any) -> None:
        context.trace_request_ctx.dequeued()

    async def reused(session: Any, context: Any, params: Any) -> None:
        context.trace_request_ctx.reused = True

    config.on_connection_queued_start.append(queued)
    config.on_connection_queued_end.append(dequeued)
    config.on_connection_reuseconn.append(reused)
    return config


class UpstreamStatusError(UpstreamError):
    """The upstream answered with an error status; its status and message are passed on."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = "invalid_request_error" if status < 500 else "upstream_error"


def _error_message(status: int, text: str) -> str:
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, a number too long, nesting too deep
        return f"upstream returned HTTP {status}: {text[:200]}"
    error = body.get("error", body) if isinstance(body, dict) else body
    message = error.get("message") if isinstance(error, dict) else None
    return f"upstream: {message}" if message else f"upstream returned HTTP {status}: {text[:200]}"


def has_dot_segment(raw_path: str) -> bool:
    """Whether a raw path holds a `.` or `..` segment, percent-encoded or not (an encoded `/` splits too)."""
    return any(segment in (".", "..") for segment in unquote(raw_path).replace("\\", "/").split("/"))


def join_url(base: URL, path_qs: str) -> URL:
    """`base` with an encoded path (and query) appended as it is: the base path is always kept.

    Joined as strings, yarl would resolve `..` (and `%2e%2e`) and climb out of the base path, so a
    path with such a segment is refused, and the URL is built from encoded parts that nothing resolves.
    """
    path, _, query = path_qs.partition("?")
    if not path.startswith("/") or has_dot_segment(path):
        raise BadRequestError("the request path must be absolute, without '.' or '..' segments")
    return URL.build(scheme=base.scheme, authority=base.raw_authority, path=base.raw_path.rstrip("/") + path,
                     query_string=query, encoded=True)


class Upstream:
    """A base URL, its credentials and one aiohttp ClientSession with a pool of `connections`."""

    def __init__(self, base_url: str, timeouts: Timeouts, *, api_key: str | None = None,
                 connections: int = DEFAULT_CONNECTIONS, gate: CoreGate | None = None,
                 max_answer_bytes: int = MAX_ANSWER_BYTES, forward_client_key: bool = False) -> None:
        self.base_url = URL(base_url.rstrip("/"))
        self.gate = gate  # the proxy's own calls take turns with its draft model on shared cores
        self.timeouts = timeouts
        self.connections = connections
        self.max_answer_bytes = max_answer_bytes
        self._api_key = api_key
        self._forward_client_key = forward_client_key  # a client's key replaces the route's (else: where it has none)
        # total=None: a long stream is healthy while bytes flow; silence is what times out (read_body and
        # iter_body: aiohttp's sock_read would also cut the wait for the head at `idle`). The pool's wait and
        # the head are timed by open().
        timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=timeouts.connect)
        connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=KEEPALIVE_S)
        # auto_decompress=False: passthrough forwards bodies byte for byte with their encoding.
        self.session = aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False,
                                             trace_configs=[_trace()])

    def auth_headers(self, client_headers: Mapping[str, str] | None = None) -> dict[str, str]:
        """The key headers to send: the route's key, unless it has none or forwards the client's (then the key
        headers the client sent)."""
        sent = key_headers(client_headers or {})
        if self._api_key and not (self._forward_client_key and sent):
            return {"Authorization": f"Bearer {self._api_key}"}
        return sent

    async def open(self, method: str, path: str, *, headers: Mapping[str, str], data: Any = None,
                   params: Any = None, idempotent: bool = False) -> aiohttp.ClientResponse:
        """Send a request and wait for the response head. An `idempotent` request that meets a kept-alive
        connection the server has closed (before any byte of an answer) is sent once more."""
        retry = idempotent
        while True:
            attempt = _Attempt(self.timeouts)
            try:
                return await self._send(attempt, method, path, headers, data, params)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # A connection that was never made (ClientConnectorError) is no stale one.
                if not (retry and attempt.reused and not isinstance(exc, aiohttp.ClientConnectorError)):
                    raise UpstreamUnavailableError(f"upstream unreachable: {type(exc).__name__}: {exc}") from exc
                log.info("upstream_retry", path=path, reason=f"kept-alive connection closed: {type(exc).__name__}")
                retry = False

    async def _send(self, attempt: _Attempt, method: str, path: str, headers: Mapping[str, str], data: Any,
                    params: Any) -> aiohttp.ClientResponse:
        """One send, its deadline moved by the attempt's phases; timeouts and aiohttp's other errors translated."""
        try:
            async with asyncio.timeout(self.timeouts.first_byte) as deadline:
                attempt.deadline = deadline
                return await self.session.request(method, join_url(self.base_url, path), headers=headers, data=data,
                                                  params=params, allow_redirects=False, trace_request_ctx=attempt)
        except aiohttp.ConnectionTimeoutError as exc:
            raise UpstreamTimeoutError(f"upstream did not accept a connection within {self.timeouts.connect:g} s "
                                       "(timeouts.connect)") from exc
        except TimeoutError as exc:
            if attempt.queued_since is not None:
                raise UpstreamBusyError(
                    f"no free connection to the upstream within {self.timeouts.pool:g} s: all {self.connections} "
                    "of the route's connections are busy (upstream.connections, timeouts.pool)") from exc
            raise UpstreamTimeoutError(f"upstream sent nothing within {self.timeouts.first_byte:g} s") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            raise  # open() decides whether to send again
        except aiohttp.ClientError as exc:
            raise UpstreamUnavailableError(f"upstream unreachable: {type(exc).__name__}: {exc}") from exc

    async def post_json(self, path: str, body: Any, *, client_headers: Mapping[str, str] | None = None) -> Any:
        """POST JSON and return the decoded JSON answer, or raise one of our errors. Every JSON call the proxy
        makes (scoring, tokenizing, probing) reads state only, so a stale connection is retried."""
        return await self._json("POST", path, dumps(body), client_headers)

    async def get_json(self, path: str) -> Any:
        """GET JSON (probes at start-up)."""
        return await self._json("GET", path, None, None)

    async def _json(self, method: str, path: str, data: str | None, client_headers: Mapping[str, str] | None) -> Any:
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity",
                   **self.auth_headers(client_headers)}
        async with self.gate.turn(TARGET) if self.gate is not None else contextlib.nullcontext():
            try:
                async with asyncio.timeout(self.timeouts.total):
                    response = await self.open(method, path, headers=headers, data=data, idempotent=True)
                    async with response:
                        text = await read_body(response, self.timeouts.idle, limit=self.max_answer_bytes, path=path)
            except TimeoutError as exc:  # each phase's own timeout is translated inside: this one is the whole call's
                raise UpstreamTimeoutError(f"upstream did not finish answering {path} within "
                                           f"{self.timeouts.total:g} s") from exc
        if response.status != 200:
            raise UpstreamStatusError(response.status, _error_message(response.status, text.decode(errors="replace")))
        try:
            return loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UpstreamUnavailableError(f"upstream sent invalid JSON for {path}") from exc
        except ValueError as exc:  # an int of more digits than Python converts (sys.get_int_max_str_digits)
            raise UpstreamUnavailableError(f"upstream sent invalid JSON for {path} (a number too long to read)") \
                from exc
        except RecursionError as exc:
            raise UpstreamUnavailableError(f"upstream sent JSON nested too deeply for {path}") from exc

    async def close(self) -> None:
        """Close the pooled connections."""
        await self.session.close()
