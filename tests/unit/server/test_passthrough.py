"""Passthrough: SSE events forwarded as they come whatever their line endings, metered, never compressed, and
capped in size; request bodies as the upstream can read them; hop-by-hop headers kept to their hop.

The proxy runs in-process (create_app) with one route passing through to an upstream app that
streams events one at a time, each only once the test has seen the one before reach the client,
or that records what reached it.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st

from proxy.config.load import parse_config
from proxy.server import passthrough
from proxy.server.app import create_app
from proxy.server.passthrough import EventSplitter, TokenMeter, split_events

PIECES = ["Hel", "lo", " there"]
NEXT = web.AppKey("next", asyncio.Queue)  # the test puts one item per event it lets the upstream send
SEEN = web.AppKey("seen", list)


def _events(ending: bytes) -> list[bytes]:
    chunks = [{"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]} for piece in PIECES]
    return [b"data: " + json.dumps(chunk).encode() + ending * 2 for chunk in chunks] + [b"data: [DONE]" + ending * 2]


@pytest.mark.parametrize(("data", "events", "rest"), [
    (b"data: a\n\ndata: b", [b"data: a\n\n"], b"data: b"),
    (b"data: a\r\n\r\ndata: b\r\n", [b"data: a\r\n\r\n"], b"data: b\r\n"),
    (b"data: a\r\rdata: b\r\r", [b"data: a\r\r", b"data: b\r\r"], b""),
    (b"data: a\r\n", [], b"data: a\r\n"),  # a CRLF is one line ending, not two
    (b"data: a\r", [], b"data: a\r"),
    (b"event: x\ndata: a\n\r\n", [b"event: x\ndata: a\n\r\n"], b""),  # endings may be mixed
])
def test_split_events(data: bytes, events: list[bytes], rest: bytes) -> None:
    assert split_events(data) == (events, rest)


def rescanning(pieces: list[bytes]) -> tuple[list[bytes], bytes]:
    """The events in `pieces` as found by scanning all that is pending again on every piece."""
    events, pending = [], b""
    for piece in pieces:
        found, pending = split_events(pending + piece)
        events += found
    return events, pending


@given(st.lists(st.text(alphabet="a:\r\n", max_size=6).map(str.encode), max_size=30))
def test_a_splitter_fed_piece_by_piece_finds_what_rescanning_finds(pieces: list[bytes]) -> None:
    splitter = EventSplitter()
    events = [event for piece in pieces for event in splitter.feed(piece)]
    assert (events, bytes(splitter.pending)) == rescanning(pieces)


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_the_meter_counts_events_whatever_their_line_endings(ending: bytes) -> None:
    meter = TokenMeter()
    for event in _events(ending):
        for at in range(0, len(event), 7):  # split anywhere, CRLFs included
            meter.feed(event[at:at + 7], 0.0)
    assert meter.completion_tokens() == len(PIECES)


@pytest.mark.parametrize(("body", "tokens"), [
    (b'{"usage": {"completion_tokens": 7}}', 7),
    (b'{"usage": {"completion_tokens": ' + b"1" * 400 + b"}}", None),  # no count: no rate is measured from it
    (b'{"usage": {"completion_tokens": true}}', None),
    (b'{"usage": {"completion_tokens": ' + b"1" * 5000 + b"}}", None),  # more digits than Python reads
    (b"[" * 100_000 + b"]" * 100_000, None),  # deeper than Python's recursion limit
], ids=["a count", "a huge count", "a bool", "a number too long", "nesting too deep"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_meter_takes_only_a_count_for_a_count(body: bytes, tokens: int | None, stream: bool) -> None:
    meter = TokenMeter()
    meter.feed(b"data: " + body + b"\n\n" if stream else body, 0.0)
    assert meter.completion_tokens() == tokens


def upstream_app(ending: bytes) -> web.Application:
    """Streams chat chunks ending their lines with `ending`, each event once the test allows it."""

    async def chat(request: web.Request) -> web.StreamResponse:
        request.app[SEEN].append(request.headers.get("Accept-Encoding"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in _events(ending):
            await request.app[NEXT].get()
            await response.write(event)
        return response

    app = web.Application()
    app[NEXT], app[SEEN] = asyncio.Queue(), []
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def proxy_in_front_of(upstream: TestServer) -> AsyncIterator[TestServer]:
    config = parse_config({"routes": [{"name": "plain", "upstream": {"url": str(upstream.make_url("")),
                                                                     "protocol": "openai"}}]})
    proxy = TestServer(create_app(config))
    await proxy.start_server()
    yield proxy
    await proxy.close()


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
async def test_events_reach_the_client_as_they_come_and_uncompressed(ending: bytes) -> None:
    upstream = TestServer(upstream_app(ending))
    await upstream.start_server()
    body = {"model": "plain", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    try:
        async for proxy in proxy_in_front_of(upstream):
            async with aiohttp.ClientSession() as session, session.post(
                    proxy.make_url("/v1/chat/completions"), json=body,
                    headers={"Accept-Encoding": "gzip, deflate, br"}) as response:
                received = b""
                for event in _events(ending):
                    upstream.app[NEXT].put_nowait(None)  # the upstream sends one event and waits for the next go
                    while not received.endswith(event):  # it must arrive before the stream ends
                        received += await asyncio.wait_for(response.content.readany(), 5)
            assert received == b"".join(_events(ending))
        assert upstream.app[SEEN] == ["identity"]
    finally:
        await upstream.close()


# Requests and answers forwarded: bodies as the upstream can read them, hop-by-hop headers kept to their hop.

RECEIVED = web.AppKey("received", list)  # (headers, raw body) of each request the recording upstream got
ANSWER_HEADERS = {"Connection": "X-Back", "X-Back": "hop", "Keep-Alive": "timeout=5", "X-Kept-Back": "end"}
CHAT_BODY = {"model": "plain", "messages": [{"role": "user", "content": "hi"}]}
CHAT_PATH = "/v1/chat/completions"
PATHS = [CHAT_PATH, "/v1/embeddings"]  # a generation passed through, and any other path


def recording_app() -> web.Application:
    """Answers every POST with JSON and headers naming one of theirs hop-by-hop; records what it received."""

    async def handle(request: web.Request) -> web.Response:
        request.app[RECEIVED].append((request.headers.copy(), await request.read()))
        return web.json_response({"ok": True}, headers=ANSWER_HEADERS)

    app = web.Application()
    app[RECEIVED] = []
    app.router.add_post("/{tail:.*}", handle)
    return app


@asynccontextmanager
async def recording_proxy() -> AsyncIterator[tuple[TestServer, TestServer]]:
    """The proxy and, behind it, a recording upstream that reads bodies as they came over the wire."""
    upstream = TestServer(recording_app())
    await upstream.start_server(auto_decompress=False)
    try:
        async for proxy in proxy_in_front_of(upstream):
            yield proxy, upstream
    finally:
        await upstream.close()


ENCODINGS = [
    # (Content-Encoding sent, how the body is encoded, whether the proxy's server decoded it)
    ("gzip", gzip.compress, True),
    ("deflate", zlib.compress, True),
    ("GZIP", gzip.compress, True),  # content codings are case-insensitive (RFC 9110 §8.4.1)
    ("x-private", lambda data: data[::-1], False),  # a coding aiohttp does not know: the bytes go on as they came
]  # (a generation's body in a coding the proxy cannot read is refused, as any body that is not JSON)


@pytest.mark.parametrize(("path", "encoding", "encode", "decoded"),
                         [(path, *e) for e in ENCODINGS for path in PATHS if e[2] or path != CHAT_PATH],
                         ids=[f"{e[0]} {path}" for e in ENCODINGS for path in PATHS if e[2] or path != CHAT_PATH])
async def test_a_request_body_goes_on_encoded_as_its_content_encoding_says(
        path: str, encoding: str, encode: Callable[[bytes], bytes], decoded: bool) -> None:
    plain = json.dumps(CHAT_BODY).encode()
    async with recording_proxy() as (proxy, upstream), aiohttp.ClientSession() as session, session.post(
            proxy.make_url(path), data=encode(plain),
            headers={"Content-Encoding": encoding, "Content-Type": "application/json"}) as response:
        assert response.status == 200, await response.text()
    headers, raw = upstream.app[RECEIVED][-1]
    if decoded:  # the proxy's server decoded the body: it goes on plain, labelled plain
        assert "Content-Encoding" not in headers and json.loads(raw) == CHAT_BODY
    else:
        assert headers["Content-Encoding"] == encoding and raw == encode(plain)
    assert int(headers["Content-Length"]) == len(raw)


@pytest.mark.parametrize("path", PATHS)
async def test_hop_by_hop_headers_stop_at_the_proxy_both_ways(path: str) -> None:
    sent = {"Connection": "keep-alive, X-Hop", "X-Hop": "secret", "Keep-Alive": "timeout=5", "TE": "trailers",
            "Proxy-Connection": "keep-alive", "X-Kept": "end"}
    async with recording_proxy() as (proxy, upstream), aiohttp.ClientSession() as session, session.post(
            proxy.make_url(path), json=CHAT_BODY, headers=sent) as response:
        assert response.status == 200, await response.text()
        answered = response.headers.copy()
    received = upstream.app[RECEIVED][-1][0]
    assert received["X-Kept"] == "end"
    assert not {"X-Hop", "Keep-Alive", "TE", "Proxy-Connection"} & set(received)
    assert received.get("Connection", "keep-alive").lower() == "keep-alive"  # the proxy's own, if any
    assert answered["X-Kept-Back"] == "end"
    assert not {"X-Back", "Keep-Alive"} & set(answered)


# An SSE event that never ends.

LONG_EVENT_BYTES = 2 << 20


def test_the_meter_reads_a_long_event_in_small_pieces_in_linear_time() -> None:
    event = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * LONG_EVENT_BYTES}}]}).encode()
    meter = TokenMeter()
    started = time.perf_counter()
    for at in range(0, len(event), 512):  # every piece rescanning all before it would scan 4 GiB
        meter.feed(event[at:at + 512], 0.0)
    meter.feed(b"\n\n", 0.0)
    assert time.perf_counter() - started < 2.0
    assert meter.completion_tokens() == 1


def endless_event_app() -> web.Application:
    """Streams one whole event, then an event with no end, 1 KiB at a time, until the client leaves."""

    async def chat(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_events(b"\n")[0])
        await response.write(b"data: ")
        while True:
            await response.write(b"x" * 1024)
            await asyncio.sleep(0)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_an_event_past_the_cap_ends_the_stream_in_band(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passthrough, "MAX_EVENT_BYTES", 64 << 10)
    upstream = TestServer(endless_event_app())
    await upstream.start_server()
    body = {**CHAT_BODY, "stream": True}
    try:
        async for proxy in proxy_in_front_of(upstream):
            async with aiohttp.ClientSession() as session, session.post(
                    proxy.make_url("/v1/chat/completions"), json=body) as response:
                received = await asyncio.wait_for(response.read(), 10)
    finally:
        await upstream.close()
    first, error, done = received.split(b"\n\n")[:3]
    assert first + b"\n\n" == _events(b"\n")[0]
    assert json.loads(error.removeprefix(b"data: "))["error"]["message"] == \
        f"upstream sent an SSE event of more than {64 << 10} bytes"
    assert done == b"data: [DONE]"
