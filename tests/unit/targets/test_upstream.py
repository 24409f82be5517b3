"""The pooled upstream client: a full pool, a kept-alive connection the server closes, and each phase's timeout.

The servers are real: an aiohttp app on port 0, and a raw asyncio TCP server where a connection must
be closed at a chosen moment (something aiohttp's server never does on purpose).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.engine.gate import DRAFT, CoreGate
from proxy.errors import BadRequestError, UpstreamBusyError, UpstreamTimeoutError, UpstreamUnavailableError
from proxy.targets.upstream import Timeouts, Upstream, join_url

HOLD = web.AppKey("hold", asyncio.Event)
ANSWER = {"ok": True}


def slow_app(head_delay_s: float = 0.0) -> web.Application:
    """/hold answers once HOLD is set; /slow after head_delay_s; /fast at once."""

    async def hold(request: web.Request) -> web.Response:
        await request.app[HOLD].wait()
        return web.json_response(ANSWER)

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(head_delay_s)
        return web.json_response(ANSWER)

    async def fast(request: web.Request) -> web.Response:
        return web.json_response(ANSWER)

    app = web.Application()
    app[HOLD] = asyncio.Event()
    app.router.add_post("/hold", hold)
    app.router.add_post("/slow", slow)
    app.router.add_post("/fast", fast)
    return app


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    running = TestServer(slow_app(head_delay_s=0.8))
    await running.start_server()
    yield running
    await running.close()


async def test_a_full_pool_says_so_instead_of_blaming_the_upstream(server: TestServer) -> None:
    upstream = Upstream(str(server.make_url("")), Timeouts(pool=0.3), connections=1)
    try:
        holder = asyncio.create_task(upstream.post_json("/hold", {}))
        await asyncio.sleep(0.2)  # the one connection is taken
        with pytest.raises(UpstreamBusyError) as raised:
            await upstream.post_json("/fast", {})
        assert raised.value.status == 503 and raised.value.headers() == {"Retry-After": "1"}
        assert "no free connection" in raised.value.message
        assert "all 1 of the route's connections" in raised.value.message
        server.app[HOLD].set()
        assert await holder == ANSWER
        assert await upstream.post_json("/fast", {}) == ANSWER  # the connection is free again
    finally:
        await upstream.close()


async def test_the_first_byte_timeout_counts_from_when_a_connection_is_had(server: TestServer) -> None:
    # Waiting 1 s for the connection, then 0.8 s for the head: 1.8 s in all, more than first_byte, yet served.
    upstream = Upstream(str(server.make_url("")), Timeouts(first_byte=1.5, pool=5.0), connections=1)
    try:
        holder = asyncio.create_task(upstream.post_json("/hold", {}))
        asyncio.get_running_loop().call_later(1.0, server.app[HOLD].set)
        await asyncio.sleep(0.1)
        assert await upstream.post_json("/slow", {}) == ANSWER
        await holder
    finally:
        await upstream.close()


@pytest.mark.parametrize(("first_byte", "idle", "served"), [
    (2.0, 0.3, True),  # a head slower than `idle` (a non-streamed answer being generated) is within first_byte
    (0.3, 5.0, False),
])
async def test_the_head_is_timed_by_first_byte_not_by_idle(server: TestServer, first_byte: float, idle: float,
                                                           served: bool) -> None:
    upstream = Upstream(str(server.make_url("")), Timeouts(first_byte=first_byte, idle=idle))
    try:
        if served:
            assert await upstream.post_json("/slow", {}) == ANSWER
        else:
            with pytest.raises(UpstreamTimeoutError, match="sent nothing within 0.3 s") as raised:
                await upstream.post_json("/slow", {})
            assert raised.value.to_body()["error"]["code"] == "upstream_timeout"
    finally:
        await upstream.close()


# -- a raw server that closes kept-alive connections ------------------------------------------------------


@dataclass
class ClosingServer:
    """Answers the first request of each connection and keeps it alive; closes the connection, without a word,
    when the next request arrives on it (a keep-alive timeout racing that request)."""

    close_after: int = 1  # answers given on a connection before it is closed on the next request
    connections: int = 0
    requests: int = 0
    server: asyncio.Server | None = field(default=None, repr=False)

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                self.requests += 1
                if answered >= self.close_after:
                    return  # closed in finally, the request unanswered
                body = json.dumps(ANSWER).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
                answered += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def test_a_kept_alive_connection_the_server_closes_is_retried_once_on_a_new_one() -> None:
    fake = ClosingServer()
    upstream = Upstream(await fake.start(), Timeouts())
    try:
        assert await upstream.post_json("/generate", {}) == ANSWER
        assert await upstream.post_json("/generate", {}) == ANSWER  # the kept-alive connection is closed on it
        assert (fake.connections, fake.requests) == (2, 3)
    finally:
        await upstream.close()
        await fake.close()


async def test_a_fresh_connection_closed_unanswered_is_not_sent_again() -> None:
    fake = ClosingServer(close_after=0)  # the server drops every request: nothing stale about it
    upstream = Upstream(await fake.start(), Timeouts())
    try:
        with pytest.raises(UpstreamUnavailableError, match="ServerDisconnectedError") as raised:
            await upstream.post_json("/generate", {})
        assert raised.value.to_body()["error"]["code"] == "upstream_unavailable"
        assert (fake.connections, fake.requests) == (1, 1)
    finally:
        await upstream.close()
        await fake.close()


async def test_a_passthrough_request_is_not_retried() -> None:
    fake = ClosingServer()
    upstream = Upstream(await fake.start(), Timeouts())
    try:
        assert await upstream.post_json("/generate", {}) == ANSWER
        with pytest.raises(UpstreamUnavailableError):  # a client's POST: not ours to send twice
            await upstream.open("POST", "/v1/chat/completions", headers={}, data=b"{}")
        assert fake.requests == 2
    finally:
        await upstream.close()
        await fake.close()


async def test_the_proxys_calls_wait_for_the_drafts_turn_on_shared_cores(server: TestServer) -> None:
    gate = CoreGate()
    upstream = Upstream(str(server.make_url("")), Timeouts(), gate=gate)
    plain = Upstream(str(server.make_url("")), Timeouts())
    try:
        release = asyncio.Event()

        async def draft_step() -> None:
            async with gate.turn(DRAFT):
                await release.wait()

        drafting = asyncio.create_task(draft_step())
        await asyncio.sleep(0)
        call = asyncio.create_task(upstream.post_json("/fast", {}))
        assert await plain.post_json("/fast", {}) == ANSWER  # a client without the gate is not held back
        await asyncio.sleep(0.2)
        assert not call.done()  # the draft computes: the target's turn waits
        release.set()
        assert await call == ANSWER
        await drafting
        assert gate.turns == 1 and gate.holder is None
    finally:
        await upstream.close()
        await plain.close()


# -- the URL of each call: the base path kept, whatever the path ------------------------------------------------


@pytest.mark.parametrize(("base", "path", "url"), [
    ("http://gw:8001", "/health", "http://gw:8001/health"),
    ("https://gw/team-a", "/v1/models", "https://gw/team-a/v1/models"),
    ("https://gw/team-a", "/health?verbose=1&a=%2F", "https://gw/team-a/health?verbose=1&a=%2F"),
    ("https://gw/team-a", "/v1/models/a%2Fb", "https://gw/team-a/v1/models/a%2Fb"),  # escapes stay as sent
    ("https://gw/team-a", "/v1//x/", "https://gw/team-a/v1//x/"),  # empty segments too
    ("http://[::1]:8001/a%20b", "/tokenize", "http://[::1]:8001/a%20b/tokenize"),
])
def test_a_path_is_appended_to_the_base_path(base: str, path: str, url: str) -> None:
    assert str(join_url(URL(base), path)) == url


@pytest.mark.parametrize("path", ["/../admin", "/%2e%2e/admin", "/a/%2E./b", "/a/./b", "/a/..%2F..%2Fb", "/a/..",
                                  "/a\\..\\b", "admin", ""])
def test_a_path_that_could_leave_the_base_path_is_refused(path: str) -> None:
    with pytest.raises(BadRequestError, match="without '.' or '..' segments"):
        join_url(URL("https://gw/team-a"), path)
