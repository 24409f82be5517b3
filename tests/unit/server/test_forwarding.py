"""What the catch-all forwards: the OpenAI API, the protocol's read-only info paths and the route's listed paths,
always below the upstream's base path, never from another site's page and never from under the live page's prefix.

The proxy runs in-process (create_app) with one route whose upstream URL has a base path (`/team-a`) and a key;
the upstream records every request that reaches it, whatever its path.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.config.load import parse_config
from proxy.server.app import create_app

BASE = "/team-a"
KEY = "sk-team-a"
SEEN = web.AppKey("seen", list)


def recording_upstream() -> web.Application:
    """A server that answers every method and path, recording (method, raw path, Authorization)."""

    async def anything(request: web.Request) -> web.Response:
        request.app[SEEN].append((request.method, request.raw_path, request.headers.get("Authorization")))
        return web.json_response({"ok": True})

    app = web.Application()
    app[SEEN] = []
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


@pytest.fixture
async def upstream() -> AsyncIterator[TestServer]:
    server = TestServer(recording_upstream())
    await server.start_server()
    yield server
    await server.close()


async def running_proxy(upstream: TestServer, protocol: str = "sglang", **route: Any) -> AsyncIterator[TestServer]:
    config = parse_config({"server": {"live": True}, "routes": [
        {"name": "gw", "upstream": {"url": str(upstream.make_url(BASE)), "protocol": protocol, "api_key": KEY},
         **route}]})
    proxy = TestServer(create_app(config))
    await proxy.start_server()
    yield proxy
    await proxy.close()


async def send(proxy: TestServer, method: str, raw_path: str, headers: dict[str, str] | None = None
               ) -> tuple[int, dict[str, Any] | None]:
    """One request with its path sent exactly as written (dot segments and escapes kept)."""
    url = URL(str(proxy.make_url("")).rstrip("/") + raw_path, encoded=True)
    body = b"{}" if method == "POST" else None
    sent = {"Content-Type": "application/json", **(headers or {})}
    async with aiohttp.ClientSession() as session, session.request(method, url, data=body, headers=sent) as reply:
        raw = await reply.read()
    return reply.status, json.loads(raw) if reply.content_type == "application/json" and raw else None


def assert_openai_error(status: int, body: dict[str, Any] | None, expected: int) -> None:
    assert status == expected, body
    assert body is not None and set(body["error"]) == {"message", "type", "param", "code"}, body


FORWARDED = [
    # (protocol, method, path): the OpenAI API, then each protocol's read-only info paths
    ("sglang", "POST", "/v1/embeddings"),
    ("sglang", "POST", "/v1/responses"),
    ("sglang", "GET", "/v1/models/some-model"),
    ("sglang", "GET", "/health"),
    ("sglang", "GET", "/health?verbose=1"),
    ("sglang", "HEAD", "/health"),
    ("sglang", "GET", "/get_model_info"),
    ("sglang", "GET", "/model_info"),
    ("sglang", "GET", "/server_info"),
    ("sglang", "GET", "/get_server_info"),
    ("sglang", "POST", "/tokenize"),
    ("sglang", "POST", "/v1/tokenize"),
    ("sglang", "POST", "/v1/detokenize"),
    ("vllm", "GET", "/health"),
    ("vllm", "GET", "/version"),
    ("vllm", "POST", "/tokenize"),
    ("vllm", "POST", "/detokenize"),
    ("openai", "POST", "/v1/embeddings"),
]


@pytest.mark.parametrize(("protocol", "method", "path"), FORWARDED)
async def test_listed_paths_are_forwarded_below_the_base_path_with_the_routes_key(
        upstream: TestServer, protocol: str, method: str, path: str) -> None:
    async for proxy in running_proxy(upstream, protocol):
        status, _ = await send(proxy, method, path)
    assert status == 200
    assert upstream.app[SEEN] == [(method, BASE + path, f"Bearer {KEY}")]


REFUSED = [
    # (protocol, method, path): what changes a server's state, and whatever no list names
    ("sglang", "GET", "/flush_cache"),  # an <img src> on any page would flush the cache with the route's key
    ("sglang", "POST", "/flush_cache"),
    ("sglang", "GET", "/start_profile"),
    ("sglang", "POST", "/update_weights_from_disk"),
    ("sglang", "POST", "/generate"),
    ("sglang", "GET", "/version"),  # vLLM's, not SGLang's
    ("vllm", "POST", "/reset_prefix_cache"),
    ("vllm", "POST", "/sleep"),
    ("vllm", "POST", "/v1/load_lora_adapter"),
    ("vllm", "GET", "/get_model_info"),  # SGLang's, not vLLM's
    ("openai", "GET", "/health"),
    ("sglang", "GET", "/no/such/path"),
    ("sglang", "GET", "/v1/modelsX"),
    ("sglang", "POST", "/speculoos/anything"),
    ("sglang", "POST", "/speculoos/live"),  # the page answers GET only; nothing else under it is forwarded
    ("sglang", "GET", "/speculoos/live/x"),
]


@pytest.mark.parametrize(("protocol", "method", "path"), REFUSED)
async def test_other_paths_get_a_404_and_never_reach_the_upstream(upstream: TestServer, protocol: str, method: str,
                                                                   path: str) -> None:
    async for proxy in running_proxy(upstream, protocol):
        status, body = await send(proxy, method, path)
    assert_openai_error(status, body, 404)
    assert upstream.app[SEEN] == []


async def test_a_route_forwards_the_paths_it_lists(upstream: TestServer) -> None:
    async for proxy in running_proxy(upstream, "sglang", passthrough={"paths": ["/stats", "/v2/*"]}):
        for path in ("/stats", "/v2/a/b"):
            assert (await send(proxy, "GET", path))[0] == 200
        status, body = await send(proxy, "GET", "/flush_cache")
    assert_openai_error(status, body, 404)
    assert [path for _, path, _ in upstream.app[SEEN]] == [BASE + "/stats", BASE + "/v2/a/b"]


DOT_SEGMENTS = [
    "/../admin/x",
    "/health/../../admin/x",
    "/%2e%2e/admin/x",
    "/%2E%2e/admin/x",
    "/.%2e/admin/x",
    "/v1/models/..%2f..%2fadmin",
    "/./health",
    "/health/.",
    "/speculoos/live/x/../../../v1/models",
]


@pytest.mark.parametrize("path", DOT_SEGMENTS)
async def test_dot_segments_are_refused_before_anything_is_forwarded(upstream: TestServer, path: str) -> None:
    async for proxy in running_proxy(upstream):
        status, body = await send(proxy, "GET", path)
    assert_openai_error(status, body, 400)
    assert upstream.app[SEEN] == []


@pytest.mark.parametrize("path", ["/speculoos/live/x", "/speculoos/live/x/../../../v1/models",
                                  "/speculoos/live/events/x", "/v1/models"])
async def test_under_the_live_prefix_a_foreign_host_reaches_nothing(upstream: TestServer, path: str) -> None:
    async for proxy in running_proxy(upstream):
        status, body = await send(proxy, "GET", path, {"Host": "evil.example"})
    assert status in (400, 403, 404) and body is not None and "error" in body
    assert upstream.app[SEEN] == []


@pytest.mark.parametrize(("path", "site", "forwarded"), [
    ("/health", "cross-site", False),  # an <img src> on another site's page
    ("/health", "same-site", False),  # ... or on another port of this host
    ("/health", "same-origin", True),
    ("/health", "none", True),  # typed into the address bar
    ("/v1/embeddings", "cross-site", True),  # the API keeps the Origin rules (a POST from a page carries one)
])
async def test_browsers_reach_the_other_paths_from_this_origin_only(upstream: TestServer, path: str, site: str,
                                                                   forwarded: bool) -> None:
    async for proxy in running_proxy(upstream):
        status, body = await send(proxy, "POST" if path.startswith("/v1") else "GET", path, {"Sec-Fetch-Site": site})
    if forwarded:
        assert status == 200 and len(upstream.app[SEEN]) == 1
    else:
        assert_openai_error(status, body, 403)
        assert upstream.app[SEEN] == []
