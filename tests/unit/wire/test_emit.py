"""Errors once bytes are out (proxy/wire/emit.py, proxy/wire/errors.py): a real app on a loopback port, read raw.

Whatever fails after a stream's head is sent ends it with an OpenAI error event and [DONE], never with a
second status line inside the chunked body; a bug's traceback goes to our log, never to the client.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.errors import UpstreamUnavailableError
from proxy.wire.emit import write_generation
from proxy.wire.errors import INTERNAL_MESSAGE, error_middleware
from proxy.wire.request import COMPLETION, parse_generation_request
from proxy.wire.shapers import Report
from proxy.wire.textstream import TextStream
from tests.fakes.toy_model import ToyVocabulary
from tests.support import sse_events

SECRET = "secret detail of the failure"


def boom() -> None:
    raise RuntimeError(SECRET)


def fails_with(exc: Exception | None, after: int) -> Callable[[], AsyncIterator[Sequence[int]]]:
    """Token batches that raise `exc` after `after` of them (None: that end there)."""

    async def batches() -> AsyncIterator[Sequence[int]]:
        for token in range(1, after + 1):
            yield [token]
        if exc is not None:
            raise exc

    return batches


def generation(batches: Callable[[], AsyncIterator[Sequence[int]]], *, extension: Callable[[], Any] | None = None,
               then: Callable[[], None] | None = None) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A handler that writes a generation of toy tokens, then calls `then`."""

    async def handle(request: web.Request) -> web.StreamResponse:
        parsed = parse_generation_request(await request.json(), COMPLETION)
        vocabulary = ToyVocabulary()
        stream = TextStream(vocabulary.token_bytes, vocabulary.is_end_of_generation, max_tokens=parsed.max_tokens)
        response, _ = await write_generation(request, parsed, batches(), stream, 3,
                                             shapers=[Report(extension)] if extension is not None else ())
        if then is not None:
            then()
        return response

    return handle


async def raw_bytes_then_bug(request: web.Request) -> web.StreamResponse:
    """A response that is not an SSE stream of ours, partly out when a bug strikes."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(b'{"partial": ')
    boom()
    return response


HANDLERS = {
    "/bug-mid-stream": generation(fails_with(RuntimeError(SECRET), 2)),
    "/upstream-mid-stream": generation(fails_with(UpstreamUnavailableError("upstream answer rejected: x"), 2)),
    "/bug-before-any-byte": generation(fails_with(RuntimeError(SECRET), 0)),
    "/bug-in-the-usage-chunk": generation(fails_with(None, 2), extension=boom),
    "/bug-after-the-end": generation(fails_with(None, 2), then=boom),
    "/raw-bytes-then-bug": raw_bytes_then_bug,
}


def app() -> web.Application:
    application = web.Application(middlewares=[error_middleware])
    for path, handler in HANDLERS.items():
        application.router.add_post(path, handler)
    return application


def exchange(port: int, path: str, body: dict[str, Any]) -> bytes:
    """Everything the server sends for one request on a connection of its own, until it closes."""
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(head + payload)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    return received


def dechunk(raw: bytes) -> tuple[bytes, bytes, bool]:
    """Head, chunked body, and whether the body ended with its last (empty) chunk."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    body = b""
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)  # a status line here would not parse
        if size == 0:
            return head, body, True
        body, rest = body + rest[:size], rest[size + 2:]
    return head, body, False


async def served(path: str, body: dict[str, Any]) -> bytes:
    server = TestServer(app())
    await server.start_server()
    try:
        assert server.port is not None
        return await asyncio.to_thread(exchange, server.port, path, body)  # a blocking client beside the server
    finally:
        await server.close()


STREAM = {"model": "toy", "prompt": "hi", "max_tokens": 8, "stream": True}

IN_BAND = [
    # (path, the error event's type, its code, its message)
    ("/bug-mid-stream", "internal_error", 500, INTERNAL_MESSAGE),
    ("/upstream-mid-stream", "upstream_error", "upstream_unavailable", "upstream answer rejected: x"),
    ("/bug-in-the-usage-chunk", "internal_error", 500, INTERNAL_MESSAGE),
]


@pytest.mark.parametrize("path, error_type, code, message", IN_BAND, ids=[case[0] for case in IN_BAND])
async def test_a_failure_after_the_head_ends_the_stream_in_band(path: str, error_type: str, code: int,
                                                               message: str) -> None:
    body = {**STREAM, "stream_options": {"include_usage": True}}
    with structlog.testing.capture_logs() as logs:
        raw = await served(path, body)
    head, sse, complete = dechunk(raw)
    assert raw.count(b"HTTP/1.1 ") == 1 and head.startswith(b"HTTP/1.1 200")
    assert complete
    events = sse_events(sse)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert events[-2] == {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    assert all(set(event) != {"error"} for event in events[:-2])
    assert SECRET.encode() not in raw
    if error_type == "internal_error":  # a bug of ours: its traceback in our log
        logged = [entry for entry in logs if entry["event"] == "unhandled_error"]
        assert logged and isinstance(logged[0]["exc_info"], RuntimeError)


async def test_a_bug_before_any_byte_is_a_clean_500() -> None:
    raw = await served("/bug-before-any-byte", STREAM)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500") and raw.count(b"HTTP/1.1 ") == 1
    assert json.loads(body)["error"]["message"] == INTERNAL_MESSAGE


async def test_a_bug_in_a_json_answer_is_a_clean_500() -> None:
    raw = await served("/bug-mid-stream", {**STREAM, "stream": False})
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500") and raw.count(b"HTTP/1.1 ") == 1
    assert json.loads(body) == {"error": {"message": INTERNAL_MESSAGE, "type": "internal_error", "param": None,
                                          "code": 500}}


async def test_a_bug_after_the_stream_ended_leaves_it_whole() -> None:
    with structlog.testing.capture_logs() as logs:
        raw = await served("/bug-after-the-end", STREAM)
    _, sse, complete = dechunk(raw)
    assert complete and raw.count(b"HTTP/1.1 ") == 1
    events = sse_events(sse)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1 and all("error" not in e for e in events[:-1])
    assert any(entry["event"] == "error_after_stream_end" for entry in logs)


async def test_a_bug_after_other_bytes_cuts_the_connection_without_a_second_head() -> None:
    raw = await served("/raw-bytes-then-bug", STREAM)
    head, body, complete = dechunk(raw)
    assert head.startswith(b"HTTP/1.1 200") and raw.count(b"HTTP/1.1 ") == 1
    assert body == b'{"partial": ' and not complete  # cut short: the client knows the answer is broken
