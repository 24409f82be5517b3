"""A route's controller learns only from what measures its target: not from rounds a client forced or pinned, nor
from a stream a client read too slowly."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
import structlog.testing
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.config.load import parse_config
from proxy.control.costs import RouteCosts
from proxy.server.app import create_app
from proxy.server.runtime import RUNTIMES
from tests.unit.server.test_request_edges import COMPLETIONS_PATH, MODE, post, start_proxy

BODY = {"model": "toy", "prompt": "a", "max_tokens": 12, "temperature": 0}


def measured(costs: RouteCosts) -> dict[str, int]:
    """How many observations each of the route's measurements has folded in."""
    counts = {"alpha": costs.alpha.samples, "plain": costs.plain_per_token.samples,
              "reading": costs.plain_reading_per_token.samples, "model_rounds": costs.model_round_seconds.samples,
              "lookup_alpha": costs.lookup_alpha.samples, "draft": costs.draft_per_token.samples}
    return counts | {f"verify k={k}": e.samples for k, e in costs.verify_by_k.items()}


@pytest.mark.parametrize(("header", "learns"), [
    ("on", False),  # forced at the route's K
    ("k=2", False),  # pinned by the client
    ("auto", True),  # the controller's own choice: the control that shows the counts can move
])
async def test_only_the_controllers_own_requests_feed_the_routes_measurements(tmp_path: Path, header: str,
                                                                              learns: bool) -> None:
    async for server, _ in start_proxy(tmp_path):
        costs = server.app[RUNTIMES]["toy"].controller.costs
        before = measured(costs)
        status, headers, body = await post(server, COMPLETIONS_PATH, BODY, {"X-Speculoos": header})
        assert status == 200 and headers[MODE] == "speculative", body[:300]
        figures = json.loads(body)["speculoos"]
        assert figures["rounds"] + figures["plain_tokens"] > 0
        assert (measured(costs) != before) is learns, (before, measured(costs))


def streaming_upstream(events: int, content_bytes: int, pause_s: float) -> web.Application:
    """Streams `events` chat chunks of `content_bytes` each, `pause_s` apart, then the usage."""

    async def chat(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(events):
            chunk = {"choices": [{"index": 0, "delta": {"content": "x" * content_bytes}}]}
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(pause_s)
        await response.write(b'data: {"choices": [], "usage": {"completion_tokens": %d}}\n\n' % events)
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@asynccontextmanager
async def passing_through(upstream: web.Application) -> AsyncIterator[TestServer]:
    """A proxy whose one route forwards every request to `upstream` untouched."""
    fake = TestServer(upstream)
    await fake.start_server()
    route = {"name": "plain", "match": {"model": "*"},
             "upstream": {"url": str(fake.make_url("")), "protocol": "openai"}}
    proxy = TestServer(create_app(parse_config({"routes": [route]})))
    await proxy.start_server()
    try:
        yield proxy
    finally:
        await proxy.close()
        await fake.close()


@pytest.mark.parametrize(("upstream", "client_pause_s", "learns"), [
    # 12 MiB in one go while the client reads nothing for a second: TCP holds the upstream back for the client.
    (streaming_upstream(48, 256 << 10, 0.0), 1.0, False),
    # A model's pace read as it comes: the control that shows a passthrough stream is measured.
    (streaming_upstream(24, 8, 0.005), 0.0, True),
], ids=["a client that reads slowly", "a client that keeps up"])
async def test_a_stream_a_client_held_back_does_not_time_the_targets_decoding(upstream: web.Application,
                                                                              client_pause_s: float,
                                                                              learns: bool) -> None:
    async with passing_through(upstream) as proxy:
        costs = proxy.app[RUNTIMES]["plain"].controller.costs
        before = costs.plain_per_token.samples
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with aiohttp.ClientSession() as session, \
                session.post(proxy.make_url("/v1/chat/completions"), json=body) as reply:
            assert reply.status == 200
            await reply.content.readany()
            await asyncio.sleep(client_pause_s)
            assert (await reply.read()).endswith(b"data: [DONE]\n\n")
        assert (costs.plain_per_token.samples > before) is learns


async def test_a_client_that_hangs_up_mid_stream_is_logged_as_gone_not_as_our_error() -> None:
    async with passing_through(streaming_upstream(400, 8, 0.01)) as proxy:
        with structlog.testing.capture_logs() as logs:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            async with aiohttp.ClientSession() as session:
                reply = await session.post(proxy.make_url("/v1/chat/completions"), json=body)
                await reply.content.readline()
                reply.close()  # hang up mid-stream
            async with asyncio.timeout(30):  # the proxy notices at its next write
                while not any(entry["event"] == "request" for entry in logs):
                    await asyncio.sleep(0.02)
        logged = next(entry for entry in logs if entry["event"] == "request")
        assert (logged["status"], logged["error"]) == (499, "client disconnected")
