"""The cap on requests in flight: past it a request is a 503 with Retry-After and an OpenAI error; then served again."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config.load import parse_config
from proxy.server.app import create_app


async def test_a_request_past_the_cap_is_a_503_and_the_next_one_is_served() -> None:
    release = asyncio.Event()

    async def model(_: web.Request) -> web.Response:
        await release.wait()  # held until the test lets it go: one request stays in flight
        return web.json_response({"id": "x", "object": "model"})

    upstream_app = web.Application()
    upstream_app.router.add_get("/v1/models/x", model)
    upstream = TestServer(upstream_app)
    await upstream.start_server()
    route = {"name": "plain", "match": {"model": "*"},
             "upstream": {"url": str(upstream.make_url("")), "protocol": "openai"}}
    config = parse_config({"server": {"max_in_flight": 1}, "routes": [route]})
    proxy = TestServer(create_app(config))
    await proxy.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            held = asyncio.ensure_future(session.get(proxy.make_url("/v1/models/x")))
            await asyncio.sleep(0.2)  # it reached the upstream and waits there
            async with session.post(proxy.make_url("/v1/chat/completions"), json={"model": "m"}) as refused:
                assert refused.status == 503 and refused.headers["Retry-After"] == "1"
                error = (await refused.json())["error"]
                assert "server.max_in_flight" in error["message"] and set(error) == {"message", "type", "param", "code"}
            release.set()
            async with await held as first:
                assert first.status == 200
            async with session.get(proxy.make_url("/v1/models/x")) as again:
                assert again.status == 200
    finally:
        await proxy.close()
        await upstream.close()


def junk(lists: int) -> bytes:
    """A body of `lists` empty lists: 3 bytes each that parse into 64-byte Python lists."""
    return b'{"model": "m", "input": [' + b",".join([b"[]"] * lists) + b"]}"


class HeldEmbeddings:
    """An upstream whose /v1/embeddings answers when the test lets it."""

    def __init__(self) -> None:
        self.release, self.bodies, self.arrived = asyncio.Event(), 0, asyncio.Event()
        self.app = web.Application(client_max_size=64 << 20)
        self.app.router.add_post("/v1/embeddings", self.embeddings)

    async def embeddings(self, request: web.Request) -> web.Response:
        await request.read()
        self.bodies += 1
        self.arrived.set()
        await self.release.wait()
        return web.json_response({"object": "list", "data": []})


    async def reached(self, count: int, requests: list[asyncio.Future]) -> None:
        """Until `count` bodies arrived; fails at once if a request ends first (it was refused, say)."""
        while self.bodies < count:
            arrival = asyncio.ensure_future(self.arrived.wait())
            await asyncio.wait([arrival, *requests], return_when=asyncio.FIRST_COMPLETED)
            arrival.cancel()
            assert not any(request.done() for request in requests), "a request ended before reaching the upstream"
            self.arrived.clear()


async def proxy_for(upstream: TestServer, **server: int) -> TestServer:
    route = {"name": "plain", "match": {"model": "*"},
             "upstream": {"url": str(upstream.make_url("")), "protocol": "openai"}}
    proxy = TestServer(create_app(parse_config({"server": server, "routes": [route]})))
    await proxy.start_server()
    return proxy


async def test_bodies_that_would_parse_past_the_budget_wait_their_turn_and_one_past_it_alone_is_a_413() -> None:
    fake = HeldEmbeddings()
    upstream = TestServer(fake.app)
    await upstream.start_server()
    proxy = await proxy_for(upstream, max_parsed_bytes=4 << 20)  # one 20,000-list body (~2.9 MB estimated) at a time
    post = {"headers": {"Content-Type": "application/json"}}
    try:  # (a request the budget fails to refuse would wait at the upstream: the timeout makes it fail instead)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            for path in ("/v1/embeddings", "/v1/chat/completions"):
                async with session.post(proxy.make_url(path), data=junk(40_000), **post) as alone:
                    assert alone.status == 413 and "server.max_parsed_bytes" in (await alone.json())["error"]["message"]
            assert fake.bodies == 0  # never forwarded
            held = asyncio.ensure_future(session.post(proxy.make_url("/v1/embeddings"), data=junk(20_000), **post))
            await fake.reached(1, [held])  # the first one reached the upstream and holds its share
            async with session.post(proxy.make_url("/v1/embeddings"), data=junk(20_000), **post) as refused:
                assert refused.status == 503 and refused.headers["Retry-After"] == "1"
                assert "server.max_parsed_bytes" in (await refused.json())["error"]["message"]
            fake.release.set()
            async with await held as first:
                assert first.status == 200
            async with session.post(proxy.make_url("/v1/embeddings"), data=junk(20_000), **post) as again:
                assert again.status == 200  # the first one's share came back
    finally:
        await proxy.close()
        await upstream.close()


async def test_at_the_default_budget_such_bodies_are_served_side_by_side() -> None:
    fake = HeldEmbeddings()
    upstream = TestServer(fake.app)
    await upstream.start_server()
    proxy = await proxy_for(upstream)
    post = {"headers": {"Content-Type": "application/json"}}
    try:
        async with aiohttp.ClientSession() as session:
            requests = [asyncio.ensure_future(session.post(proxy.make_url("/v1/embeddings"), data=junk(40_000), **post))
                        for _ in range(2)]
            await fake.reached(2, requests)  # both reached the upstream at once
            fake.release.set()
            for request in requests:
                async with await request as reply:
                    assert reply.status == 200
    finally:
        await proxy.close()
        await upstream.close()


async def test_one_body_past_its_own_share_is_a_413_and_one_within_it_is_served() -> None:
    fake = HeldEmbeddings()
    fake.release.set()
    upstream = TestServer(fake.app)
    await upstream.start_server()
    proxy = await proxy_for(upstream)  # the default budget holds either body many times over
    post = {"headers": {"Content-Type": "application/json"}}
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(proxy.make_url("/v1/embeddings"), data=junk(1_000_000), **post) as refused:
                assert refused.status == 413
                assert "server.max_body_parsed_bytes" in (await refused.json())["error"]["message"]
            assert fake.bodies == 0
            async with session.post(proxy.make_url("/v1/embeddings"), data=junk(400_000), **post) as served:
                assert served.status == 200  # about 55 MiB estimated (a bracket and a comma a list)
    finally:
        await proxy.close()
        await upstream.close()
