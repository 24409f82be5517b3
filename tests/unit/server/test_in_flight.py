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
