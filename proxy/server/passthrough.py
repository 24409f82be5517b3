"""Forward a request to the upstream untouched, streaming the answer back byte for byte."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping

from aiohttp import web

from proxy.errors import UpstreamError
from proxy.targets.upstream import Upstream, iter_body
from proxy.wire.response import SSE_DONE, sse_event

# Hop-by-hop headers (RFC 9110 §7.6.1) and those aiohttp sets itself are not forwarded.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})


# An SSE event ends at a blank line; a line ends at CRLF, CR or LF (a CR before an LF is not an ending of its own).
EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r|\n)")


def forwardable(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers minus the hop-by-hop ones."""
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


def split_events(data: bytes) -> tuple[list[bytes], bytes]:
    """SSE bytes as the complete events in them (each with its blank line) and the rest, not yet complete."""
    events, start = [], 0
    for end in EVENT_END.finditer(data):
        events.append(data[start:end.end()])
        start = end.end()
    return events, data[start:]


async def forward(request: web.Request, upstream: Upstream, *, body: bytes | None = None,
                  extra_headers: dict[str, str] | None = None, meter: TokenMeter | None = None) -> web.StreamResponse:
    """Send the request on as it came (or with `body` instead) and stream the answer back."""
    headers = {k: v for k, v in forwardable(request.headers).items() if k.lower() != "accept-encoding"}
    headers.update(upstream.auth_headers(headers))
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
        pending = b""  # SSE: the bytes of an event not yet complete; only whole events are forwarded
        try:
            async for chunk in iter_body(answer, upstream.timeouts.idle):
                if meter is not None:
                    meter.feed(chunk, time.perf_counter())
                if streaming:
                    events, pending = split_events(pending + chunk)
                    chunk = b"".join(events)
                if chunk:
                    await response.write(chunk)
            if pending:
                await response.write(pending)
        except UpstreamError as exc:
            # Bytes already reached the client: report in-band where the format allows it.
            if streaming:
                await response.write(sse_event(exc.to_body()))
                await response.write(SSE_DONE)
            else:
                raise ConnectionResetError("upstream failed mid-body") from exc
        await response.write_eof()
    return response


class TokenMeter:
    """Watches a passthrough generation answer go by: completion tokens and their timing."""

    MAX_JSON_BYTES = 4 << 20  # a non-streamed answer larger than this is not parsed

    def __init__(self) -> None:
        self.first_byte: float | None = None
        self.last_byte: float | None = None
        self._buffer = b""
        self._content_chunks = 0
        self._usage_tokens: int | None = None
        self._streaming: bool | None = None

    def feed(self, chunk: bytes, now: float) -> None:
        """One piece of the body as it is forwarded."""
        self.first_byte = self.first_byte if self.first_byte is not None else now
        self.last_byte = now
        if self._streaming is None:
            self._streaming = chunk.lstrip().startswith(b"data:")
        if len(self._buffer) < self.MAX_JSON_BYTES:
            self._buffer += chunk
        if self._streaming:
            events, self._buffer = split_events(self._buffer)
            for event in events:
                self._read_event(event)

    def _read_event(self, event: bytes) -> None:
        payload = event.strip()[len(b"data:"):].strip() if event.strip().startswith(b"data:") else b""
        if not payload or payload == b"[DONE]":
            return
        try:
            body = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return  # not ours to judge; the client gets the bytes as they are
        if isinstance(body, dict):
            self._count(body)

    def _count(self, body: dict) -> None:
        usage = body.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self._usage_tokens = usage["completion_tokens"]
        for choice in body.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            if delta.get("content") or choice.get("text"):
                self._content_chunks += 1

    def completion_tokens(self) -> int | None:
        """Tokens generated: the usage figure when given, else one per content chunk."""
        if not self._streaming:
            try:
                body = json.loads(self._buffer)
            except (UnicodeDecodeError, json.JSONDecodeError):
                return None
            if isinstance(body, dict):
                self._count(body)
        return self._usage_tokens if self._usage_tokens is not None else self._content_chunks or None
