"""Requests from browsers: Host and Origin rules, as pure functions and through the running proxy; the tenant digest.

The proxy runs in-process (create_app) with one route that passes through to a small upstream that
records what reaches it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config.load import parse_config
from proxy.config.schema import ServerConfig
from proxy.server.app import create_app
from proxy.server.live import PAGE_PATH
from proxy.wire.browsers import host_allowed, origin_allowed

LISTED = "https://app.example"
CHAT = {"model": "plain", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}
SEEN = web.AppKey("seen", list)


@pytest.mark.parametrize(("host", "bind", "allowed_hosts", "allowed"), [
    ("127.0.0.1:8080", "127.0.0.1", (), True),
    ("localhost:8080", "127.0.0.1", (), True),
    ("LOCALHOST", "127.0.0.1", (), True),
    ("[::1]:8080", "127.0.0.1", (), True),
    ("127.0.0.2", "127.0.0.1", (), True),  # all of 127/8 is loopback
    (None, "127.0.0.1", (), True),  # no Host: no browser sent it
    ("evil.example:8080", "127.0.0.1", (), False),  # a name rebound to our address
    ("evil.example", "127.0.0.1", ("proxy.lan",), False),
    ("192.0.2.7:8080", "127.0.0.1", (), False),
    ("192.0.2.7:8080", "192.0.2.7", (), True),  # the bound address
    ("proxy.lan:8080", "proxy.lan", (), True),  # the bound name
    ("proxy.lan", "127.0.0.1", ("proxy.lan",), True),  # a listed name
    ("anything.example", "127.0.0.1", ("*",), True),
    ("gpu-box.lan:8080", "0.0.0.0", (), True),  # a wildcard bind takes any name until names are listed
    ("evil.example", "::", (), True),
    ("evil.example", "0.0.0.0", ("gpu-box.lan",), False),
    ("gpu-box.lan", "0.0.0.0", ("gpu-box.lan",), True),
    ("192.0.2.7", "0.0.0.0", ("gpu-box.lan",), True),  # an address is never a rebound name
    ("bad host:x", "0.0.0.0", (), False),  # not a host at all
])
def test_host_rules(host: str | None, bind: str, allowed_hosts: tuple[str, ...], allowed: bool) -> None:
    assert host_allowed(host, ServerConfig(host=bind, allowed_hosts=allowed_hosts)) is allowed


@pytest.mark.parametrize(("origin", "host", "allowed_origins", "allowed"), [
    (None, "127.0.0.1:8080", (), True),  # not a browser
    ("http://127.0.0.1:8080", "127.0.0.1:8080", (), True),  # the proxy's own origin
    ("https://localhost:8080", "localhost:8080", (), True),  # ... behind a TLS front
    ("http://localhost", "localhost:80", (), True),  # a default port written or not
    ("http://localhost:3000", "localhost:8080", (), False),  # another port is another site
    ("https://evil.example", "127.0.0.1:8080", (), False),
    ("null", "127.0.0.1:8080", (), False),  # a sandboxed page or a file
    ("null", "127.0.0.1:8080", ("null",), True),
    ("https://app.example", "127.0.0.1:8080", (LISTED,), True),
    ("https://APP.example:443", "127.0.0.1:8080", (LISTED,), True),
    ("http://app.example", "127.0.0.1:8080", (LISTED,), False),  # another scheme is another origin
    ("https://evil.example", "127.0.0.1:8080", ("*",), True),
])
def test_origin_rules(origin: str | None, host: str, allowed_origins: tuple[str, ...], allowed: bool) -> None:
    server = ServerConfig(allowed_origins=allowed_origins)
    assert origin_allowed(origin, host, server) is allowed


def upstream_app() -> web.Application:
    """An OpenAI server that answers every chat and records the headers of what reached it."""

    async def chat(request: web.Request) -> web.Response:
        request.app[SEEN].append(dict(request.headers))
        return web.json_response(ANSWER)

    app = web.Application()
    app[SEEN] = []
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture
async def upstream() -> AsyncIterator[TestServer]:
    server = TestServer(upstream_app())
    await server.start_server()
    yield server
    await server.close()


async def running_proxy(upstream: TestServer, **server: Any) -> AsyncIterator[TestServer]:
    config = parse_config({"server": {"live": True, **server}, "routes": [
        {"name": "plain", "upstream": {"url": str(upstream.make_url("")), "protocol": "openai"}}]})
    proxy = TestServer(create_app(config))
    await proxy.start_server()
    yield proxy
    await proxy.close()


@pytest.fixture
async def proxy(upstream: TestServer) -> AsyncIterator[TestServer]:
    async for server in running_proxy(upstream, allowed_origins=[LISTED]):
        yield server


def own(proxy: TestServer) -> str:
    return f"127.0.0.1:{proxy.port}"


REFUSED = [
    # (id, headers naming the proxy's own host with {own}, path)
    ("a foreign Host", {"Host": "evil.example:{port}"}, "/v1/chat/completions"),
    ("a cross-site Origin", {"Origin": "https://evil.example"}, "/v1/chat/completions"),
    ("a cross-site Origin on a passthrough path", {"Origin": "https://evil.example"}, "/v1/anything"),
    ("a rebound page's own origin", {"Host": "evil.example:{port}", "Origin": "http://evil.example:{port}"},
     "/v1/chat/completions"),
    ("a sandboxed page", {"Origin": "null"}, "/v1/chat/completions"),
]


@pytest.mark.parametrize(("headers", "path"), [pytest.param(*case[1:], id=case[0]) for case in REFUSED])
async def test_browser_requests_from_elsewhere_get_403_and_never_reach_the_upstream(
        proxy: TestServer, upstream: TestServer, headers: dict[str, str], path: str) -> None:
    sent = {k: v.format(port=proxy.port) for k, v in headers.items()}
    async with aiohttp.ClientSession() as session, \
            session.post(proxy.make_url(path), json=CHAT, headers=sent) as response:
        body = await response.json()
    assert response.status == 403
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["type"] == "permission_error"
    assert "Access-Control-Allow-Origin" not in response.headers
    assert upstream.app[SEEN] == []


SERVED = [
    # (id, headers, the CORS origin expected in the answer)
    ("no Origin (not a browser)", {}, None),
    ("the proxy's own origin", {"Origin": "http://{own}"}, None),
    ("localhost", {"Host": "localhost:{port}"}, None),
    ("a listed origin", {"Origin": LISTED}, LISTED),
]


@pytest.mark.parametrize(("headers", "cors"), [pytest.param(*case[1:], id=case[0]) for case in SERVED])
async def test_clients_and_listed_origins_are_served(proxy: TestServer, upstream: TestServer,
                                                     headers: dict[str, str], cors: str | None) -> None:
    sent = {k: v.format(port=proxy.port, own=own(proxy)) for k, v in headers.items()}
    async with aiohttp.ClientSession() as session, \
            session.post(proxy.make_url("/v1/chat/completions"), json=CHAT, headers=sent) as response:
        assert response.status == 200
        assert (await response.json())["choices"][0]["message"]["content"] == "hello"
    assert response.headers.get("Access-Control-Allow-Origin") == cors
    assert len(upstream.app[SEEN]) == 1


async def test_a_listed_origin_gets_its_preflight_answered_here(proxy: TestServer, upstream: TestServer) -> None:
    preflight = {"Origin": LISTED, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    async with aiohttp.ClientSession() as session:
        async with session.options(proxy.make_url("/v1/chat/completions"), headers=preflight) as response:
            assert response.status == 204
            assert response.headers["Access-Control-Allow-Origin"] == LISTED
            assert response.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
            assert "POST" in response.headers["Access-Control-Allow-Methods"]
        refused = {**preflight, "Origin": "https://evil.example"}
        async with session.options(proxy.make_url("/v1/chat/completions"), headers=refused) as response:
            assert response.status == 403
    assert upstream.app[SEEN] == []


async def test_a_wildcard_bind_serves_any_host_name_but_still_refuses_cross_site_pages(upstream: TestServer) -> None:
    async for proxy in running_proxy(upstream, host="0.0.0.0"):
        async with aiohttp.ClientSession() as session:
            url = proxy.make_url("/v1/chat/completions")
            async with session.post(url, json=CHAT, headers={"Host": "gpu-box.lan"}) as response:
                assert response.status == 200
            cross = {"Host": "gpu-box.lan", "Origin": "https://evil.example"}
            async with session.post(url, json=CHAT, headers=cross) as response:
                assert response.status == 403


async def test_the_live_page_answers_its_own_origin_only_whatever_is_listed(proxy: TestServer) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(proxy.make_url(PAGE_PATH), headers={"Origin": f"http://{own(proxy)}"}) as response:
            assert response.status == 200
        for origin in (LISTED, "https://evil.example"):
            async with session.get(proxy.make_url(PAGE_PATH), headers={"Origin": origin}) as response:
                assert response.status == 404
                assert "Access-Control-Allow-Origin" not in response.headers
