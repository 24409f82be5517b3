"""Forward a request to the upstream untouched, streaming the answer back byte for byte.

Untouched save for what belongs to one hop: hop-by-hop headers (RFC 9110 §7.6.1: the standard set and
every one a Connection header names) stop here both ways, and a request body aiohttp's server decoded
(Content-Encoding gzip, deflate, br or zstd) goes on decoded, without the headers that described the
encoded bytes. Decoded rather than raw because the raw bytes are gone once aiohttp has read them, and
the generation handlers read (and may rewrite) the JSON body before it is forwarded.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping

from aiohttp import web

from proxy.config.schema import Route
from proxy.control.route import PASSTHROUGH
from proxy.errors import UpstreamError, UpstreamUnavailableError
from proxy.server.runtime import METRICS, RouteRuntime
from proxy.targets.body_reading import iter_body
from proxy.targets.upstream import Upstream
from proxy.wire.control import CONTROL_FIELD
from proxy.wire.keys import without_keys
from proxy.wire.response import SSE_DONE, sse_event

# Hop-by-hop headers (RFC 9110 §7.6.1, and the old Proxy-Connection) and those aiohttp sets itself are not forwarded.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})
# The content codings aiohttp's server decodes before a handler reads the body (its http_parser.py).
DECODED_CODINGS = frozenset({"gzip", "deflate", "br", "zstd"})
# Headers that describe a body's encoded bytes: wrong once the body is decoded.
ENCODED_BODY = frozenset({"content-encoding", "content-md5", "content-digest", "repr-digest"})

# An SSE event ends at a blank line; a line ends at CRLF, CR or LF (a CR before an LF is not an ending of its own).
EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r|\n)")
LONGEST_END = 4  # CRLF CRLF
# An SSE event is held back until complete; an LLM server's are a few KiB. Meant to become a route setting.
MAX_EVENT_BYTES = 16 << 20


def forwardable(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers minus the hop-by-hop ones: the standard set and those the Connection header names."""
    named = {token.strip().lower() for name, value in headers.items() if name.lower() == "connection"
             for token in value.split(",")}
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in named}


def request_headers(request: web.Request) -> dict[str, str]:
    """What of the client's headers goes on: not its Accept-Encoding, nor what described a body now decoded."""
    dropped = {"accept-encoding"}
    if request.headers.get("Content-Encoding", "").lower() in DECODED_CODINGS:
        dropped |= ENCODED_BODY
    return {k: v for k, v in forwardable(request.headers).items() if k.lower() not in dropped}


class EventSplitter:
    """SSE bytes in, complete events out (each with its blank line); each byte is scanned for an end about once."""

    def __init__(self) -> None:
        self.pending = bytearray()  # an event not yet complete
        self._scanned = 0  # no event ends within pending[:_scanned], save one whose last bytes are still to come

    def feed(self, data: bytes) -> list[bytes]:
        """The events `data` completes; UpstreamUnavailableError once an event outgrows MAX_EVENT_BYTES."""
        self.pending += data
        events, start = [], 0
        for end in EVENT_END.finditer(self.pending, max(0, self._scanned - LONGEST_END + 1)):
            events.append(bytes(self.pending[start:end.end()]))
            start = end.end()
        del self.pending[:start]
        self._scanned = len(self.pending)
        if len(self.pending) > MAX_EVENT_BYTES:
            raise UpstreamUnavailableError(f"upstream sent an SSE event of more than {MAX_EVENT_BYTES} bytes")
        return events


def split_events(data: bytes) -> tuple[list[bytes], bytes]:
    """SSE bytes as the complete events in them (each with its blank line) and the rest, not yet complete."""
    splitter = EventSplitter()
    events = splitter.feed(data)
    return events, bytes(splitter.pending)


async def _write(response: web.StreamResponse, chunk: bytes, meter: TokenMeter | None) -> None:
    """One chunk to the client; the meter counts the time a client that reads slowly held it back."""
    if meter is None:
        await response.write(chunk)
        return
    # A write suspends only to wait for the client to take bytes (aiohttp drains a paused transport): a callback
    # queued now has run by its end exactly then. Time the proxy itself was off the CPU is not the client's.
    suspended: list[bool] = []
    handle = asyncio.get_running_loop().call_soon(suspended.append, True)
    began = time.perf_counter()
    await response.write(chunk)
    if not suspended:  # the client kept up
        handle.cancel()
        return
    meter.client_wait += time.perf_counter() - began


def upstream_body(raw: bytes, body: dict, route: Route) -> bytes:
    """The body to forward: unchanged unless the route renames the model or the client sent our field."""
    if route.upstream.model is None and CONTROL_FIELD not in body:
        return raw
    forwarded = {k: v for k, v in body.items() if k != CONTROL_FIELD}
    if route.upstream.model is not None:
        forwarded["model"] = route.upstream.model
    return json.dumps(forwarded).encode()


async def forward(request: web.Request, upstream: Upstream, *, body: bytes | None = None,
                  extra_headers: dict[str, str] | None = None, meter: TokenMeter | None = None) -> web.StreamResponse:
    """Send the request on as it came (or with `body` instead) and stream the answer back."""
    headers = request_headers(request)
    headers = {**without_keys(headers), **upstream.auth_headers(headers)}
    # Uncompressed: a compressed stream could only be forwarded, metered and framed once it had all arrived.
    headers["Accept-Encoding"] = "identity"
    data = body if body is not None else await request.read()
    answer = await upstream.open(request.method, request.rel_url.raw_path_qs, headers=headers, data=data)
    async with answer:
        response_headers = forwardable(answer.headers)
        response_headers.update(extra_headers or {})
        response = web.StreamResponse(status=answer.status, reason=answer.reason, headers=response_headers)
        if "Content-Length" in answer.headers:
            response.content_length = int(answer.headers["Content-Length"])
        await response.prepare(request)
        streaming = answer.content_type == "text/event-stream"
        events = EventSplitter() if streaming else None  # SSE: only whole events are forwarded
        try:
            async for chunk in iter_body(answer, upstream.timeouts.idle):
                if meter is not None:
                    meter.feed(chunk, time.perf_counter())
                if events is not None:
                    chunk = b"".join(events.feed(chunk))
                if chunk:
                    await _write(response, chunk, meter)
            if events is not None and events.pending:
                await response.write(bytes(events.pending))
        except UpstreamError as exc:
            # Bytes already reached the client: report in-band where the format allows it.
            if streaming:
                await response.write(sse_event(exc.to_body()))
                await response.write(SSE_DONE)
            else:
                raise ConnectionResetError("upstream failed mid-body") from exc
        await response.write_eof()
    return response


async def pass_through(request: web.Request, runtime: RouteRuntime, body: bytes, meter: TokenMeter, started: float,
                       headers: dict[str, str]) -> tuple[web.StreamResponse, int | None]:
    """Forward a generation request, measuring the target's plain decoding rate on the way; the answer's completion
    tokens where it has them."""
    response = await forward(request, runtime.upstream, body=body, extra_headers=headers, meter=meter)
    tokens = meter.completion_tokens()
    if response.status != 200 or not tokens or meter.first_byte is None:
        return response, None
    if (seconds := meter.decoding_seconds(started)) is not None:
        runtime.controller.record_plain(tokens, seconds)
    request.app[METRICS].ttft.labels(runtime.name, PASSTHROUGH).observe(meter.first_byte - started)
    return response, tokens


class TokenMeter:
    """Watches a passthrough generation answer go by: completion tokens and their timing."""

    MAX_JSON_BYTES = 4 << 20  # a non-streamed answer larger than this is not parsed
    MAX_TOKENS = 2**31 - 1  # a usage figure above this counts nothing
    # A client that held the stream back longer than this share of it also slowed the upstream (TCP pushes back):
    # the answer's pace is then the client's, not the target's.
    MAX_CLIENT_WAIT_SHARE = 0.1

    def __init__(self) -> None:
        self.first_byte: float | None = None
        self.last_byte: float | None = None
        self._buffer = bytearray()  # a non-streamed answer, kept up to MAX_JSON_BYTES
        self._events: EventSplitter | None = None  # a stream's; None once an event outgrew MAX_EVENT_BYTES
        self._content_chunks = 0
        self._usage_tokens: int | None = None
        self._streaming: bool | None = None
        self.client_wait = 0.0  # seconds spent waiting for the client to take bytes

    def feed(self, chunk: bytes, now: float) -> None:
        """One piece of the body as it is forwarded."""
        self.first_byte = self.first_byte if self.first_byte is not None else now
        self.last_byte = now
        if self._streaming is None:
            self._streaming = chunk.lstrip().startswith(b"data:")
            self._events = EventSplitter() if self._streaming else None
        if not self._streaming:
            if len(self._buffer) < self.MAX_JSON_BYTES:
                self._buffer += chunk
            return
        if self._events is None:
            return
        try:
            events = self._events.feed(chunk)
        except UpstreamUnavailableError:
            self._events = None  # the stream ends on it (forward()); the count so far stands
            return
        for event in events:
            self._read_event(event)

    def _read_event(self, event: bytes) -> None:
        payload = event.strip()[len(b"data:"):].strip() if event.strip().startswith(b"data:") else b""
        if not payload or payload == b"[DONE]":
            return
        try:
            body = json.loads(payload)
        except (ValueError, RecursionError):  # not JSON, a number too long, nesting too deep
            return  # not ours to judge; the client gets the bytes as they are
        if isinstance(body, dict):
            self._count(body)

    def _count(self, body: dict) -> None:
        usage = body.get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(tokens, int) and not isinstance(tokens, bool) and 0 <= tokens <= self.MAX_TOKENS:
            self._usage_tokens = tokens
        for choice in body.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            if delta.get("content") or choice.get("text"):
                self._content_chunks += 1

    def decoding_seconds(self, started: float) -> float | None:
        """How long the target took to decode the answer (a stream: first to last byte, so prefill is left out;
        JSON: since `started`), or None where that is not known: no bytes, or a client that read too slowly."""
        if self.first_byte is None or self.last_byte is None:
            return None
        since = self.first_byte if self.first_byte < self.last_byte else started
        seconds = self.last_byte - since
        return None if self.client_wait > self.MAX_CLIENT_WAIT_SHARE * seconds else seconds

    def completion_tokens(self) -> int | None:
        """Tokens generated: the usage figure when given, else one per content chunk."""
        if not self._streaming:
            try:
                body = json.loads(self._buffer)
            except (ValueError, RecursionError):
                return None
            if isinstance(body, dict):
                self._count(body)
        return self._usage_tokens if self._usage_tokens is not None else self._content_chunks or None
