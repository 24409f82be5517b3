"""GET /speculoos/live and its event stream in a running proxy: off, on, on which address, and what reaches it.

The proxy (tests/unit/server/live_app.py) runs in-process with a scripted drafter in front of the fake
SGLang of a toy model, and a route that passes through to a small fake OpenAI server.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.observability.live import ACCEPTED, EVERY_TENANT, PASSTHROUGH, RECOVERED, LiveFeed
from proxy.server import live
from proxy.server.live import EVENTS_PATH, PAGE_PATH
from proxy.server.live_access import serves_live
from tests.unit.server.live_app import PIECES, WRONG_AT, proxy, read_event


@pytest.mark.parametrize(("local", "host", "bind", "allowed"), [
    ("127.0.0.1", "127.0.0.1", "127.0.0.1", True),
    ("127.0.0.1", "localhost", "127.0.0.1", True),
    ("::1", "::1", "::1", True),
    ("::ffff:127.0.0.1", "127.0.0.1", "0.0.0.0", True),  # a dual-stack socket's IPv4 peer
    ("127.0.0.1", "127.0.0.1", "0.0.0.0", True),  # a wildcard bind still shows the page on loopback
    ("192.0.2.7", "192.0.2.7", "0.0.0.0", False),  # ... and nowhere else
    ("192.0.2.7", "192.0.2.7", "192.0.2.7", True),  # a deliberate bind to one address
    ("192.0.2.7", "192.0.2.7", "192.0.2.8", False),
    ("127.0.0.1", "evil.example", "127.0.0.1", False),  # a rebound name
    ("127.0.0.1", "192.0.2.7", "127.0.0.1", False),
    ("192.0.2.7", "localhost", "192.0.2.7", False),
    ("192.0.2.7", "proxy.lan", "proxy.lan", False),  # a name as bind host: loopback only
    (None, "127.0.0.1", "127.0.0.1", False),  # not an IP socket
    ("127.0.0.1", None, "127.0.0.1", False),
])
def test_serves_live_only_on_the_bind_address(local: str | None, host: str | None, bind: str, allowed: bool) -> None:
    assert serves_live(local, host, bind) is allowed


@pytest.fixture
async def live_on(tmp_path: Path) -> AsyncIterator[TestServer]:
    async for server in proxy(tmp_path, enabled=True):
        yield server


async def test_page_and_stream_answer_404_when_off(tmp_path: Path) -> None:
    async for server in proxy(tmp_path, enabled=False):
        async with aiohttp.ClientSession() as session:
            for path in (PAGE_PATH, EVENTS_PATH):
                async with session.get(server.make_url(path)) as response:
                    assert response.status == 404  # ours: the catch-all would have forwarded it upstream
        assert server.app.get(live.LIVE) is None


async def test_page_is_self_contained(live_on: TestServer) -> None:
    async with aiohttp.ClientSession() as session, session.get(live_on.make_url(PAGE_PATH)) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
        page = await response.text()
    assert EVENTS_PATH in page
    assert "http://" not in page and "https://" not in page and "src=" not in page  # nothing fetched from elsewhere


async def test_a_host_header_naming_another_host_gets_404(live_on: TestServer) -> None:
    async with aiohttp.ClientSession() as session:
        for path in (PAGE_PATH, EVENTS_PATH):
            async with session.get(live_on.make_url(path), headers={"Host": "evil.example"}) as response:
                assert response.status == 404


def lan_address() -> str:
    """This machine's address on its default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only the routing table is consulted
        return probe.getsockname()[0]


async def test_a_wildcard_bind_shows_nothing_on_another_address(tmp_path: Path) -> None:
    address = lan_address()
    async for server in proxy(tmp_path, enabled=True, host="0.0.0.0", bind="0.0.0.0"):
        async with aiohttp.ClientSession() as session:
            lan = f"http://{address}:{server.port}"
            for path in (PAGE_PATH, EVENTS_PATH):
                async with session.get(lan + path) as response:
                    assert response.status == 404
            async with session.get(f"http://127.0.0.1:{server.port}{PAGE_PATH}") as response:
                assert response.status == 200


async def test_a_page_that_goes_away_is_unsubscribed(live_on: TestServer) -> None:
    feed = live_on.app[live.LIVE]
    async with aiohttp.ClientSession() as session, session.get(live_on.make_url(EVENTS_PATH)) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        assert (await read_event(response))["type"] == "snapshot"
        assert (await read_event(response))["type"] == "routes"
        assert feed.subscribers == 1
    for _ in range(50):  # the next write (the routes, every second) finds the page gone
        if feed.subscribers == 0:
            break
        await asyncio.sleep(0.1)
    assert feed.subscribers == 0


async def test_routes_show_mode_and_costs(live_on: TestServer) -> None:
    async with aiohttp.ClientSession() as session, session.get(live_on.make_url(EVENTS_PATH)) as response:
        await read_event(response)
        routes = {r["route"]: r for r in (await read_event(response))["routes"]}
    assert routes["toy"]["mode"] == "speculative" and routes["toy"]["k"] == 4
    assert routes["plain"]["mode"] == "passthrough" and "passthrough only" in routes["plain"]["reason"]
    assert {"alpha", "reason", "plain_tokens_per_second", "predicted_tokens_per_second_by_k"} <= set(routes["toy"])
    assert "api_key" not in json.dumps(routes)


async def test_speculative_and_passthrough_requests_stream_to_the_page(live_on: TestServer) -> None:
    feed: LiveFeed = live_on.app[live.LIVE]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "temperature": 0, "stream": True}
    key = {"Authorization": "Bearer sk-never-shown"}  # the page reads as the client that sends the requests
    async with aiohttp.ClientSession() as session, session.get(live_on.make_url(EVENTS_PATH), headers=key) as page:
        assert (await read_event(page))["type"] == "snapshot"
        async with session.post(live_on.make_url("/v1/chat/completions"), json={**chat, "model": "toy"},
                                headers={"X-Speculoos": "k=4", **key}) as reply:
            assert reply.headers["X-Speculoos-Mode"] == "speculative"
            await reply.read()
        async with session.post(live_on.make_url("/v1/chat/completions"), json={**chat, "model": "other"},
                                headers=key) as reply:
            assert reply.headers["X-Speculoos-Mode"] == "passthrough"
            await reply.read()
        seen: list[dict[str, Any]] = []
        while sum(m["type"] == "end" for m in seen) < 2:
            seen.append(await read_event(page))
    assert "sk-never-shown" not in json.dumps(seen)
    speculative, passthrough = feed.snapshot(EVERY_TENANT)["requests"]
    origins = [origin for _, origin, _ in speculative["tokens"]]
    assert origins[:3] == [ACCEPTED, ACCEPTED, RECOVERED]
    assert speculative["mode"] == "speculative" and speculative["rounds"][0]["accepted"] == WRONG_AT
    assert speculative["outcome"]["status"] == 200
    assert passthrough["mode"] == "passthrough" and passthrough["outcome"]["status"] == 200
    assert passthrough["tokens"] == [(piece, PASSTHROUGH, None) for piece in PIECES]
    about = [m["type"] for m in seen if speculative["id"] in (m.get("id"), m.get("request", {}).get("id"))]
    assert about[:3] == ["begin", "mode", "tokens"] and about[-1] == "end"


async def test_a_whole_passthrough_answer_shows_as_one_piece(live_on: TestServer) -> None:
    body = {"model": "other", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(live_on.make_url("/v1/chat/completions"), json=body) as reply:
            assert reply.status == 200
    (trace,) = live_on.app[live.LIVE].snapshot(EVERY_TENANT)["requests"]
    assert trace["tokens"] == [("".join(PIECES), PASSTHROUGH, None)]
