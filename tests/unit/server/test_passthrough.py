"""Passthrough: SSE events forwarded as they come whatever their line endings, metered, and never compressed.

The proxy runs in-process (create_app) with one route passing through to an upstream app that
streams events one at a time, each only once the test has seen the one before reach the client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config.load import parse_config
from proxy.server.app import create_app
from proxy.server.passthrough import TokenMeter, split_events

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


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_the_meter_counts_events_whatever_their_line_endings(ending: bytes) -> None:
    meter = TokenMeter()
    for event in _events(ending):
        for at in range(0, len(event), 7):  # split anywhere, CRLFs included
            meter.feed(event[at:at + 7], 0.0)
    assert meter.completion_tokens() == len(PIECES)


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
