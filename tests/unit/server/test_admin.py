"""The proxy's own pages: /speculoos/status names each route's upstream without what its URL may hide."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.config.load import parse_config
from proxy.config.upstream import UpstreamConfig
from proxy.server.app import create_app

SECRET = "tok-3f9a1c"  # what ${env.TOKEN} holds


@pytest.mark.parametrize(("url", "shown"), [
    ("http://127.0.0.1:30000", "http://127.0.0.1:30000"),
    ("https://gpu.example/v1/tok-3f9a1c", "https://gpu.example/…"),  # a path may hold a secret: never shown
    ("http://gpu.example:8000/", "http://gpu.example:8000"),
    ("http://[::1]:8000/team", "http://[::1]:8000/…"),
    ("HTTP://GPU.example:8000/x", "http://gpu.example:8000/…"),
])
def test_shown_url(url: str, shown: str) -> None:
    assert UpstreamConfig(url=url).shown_url == shown


async def test_the_status_page_never_shows_a_secret_interpolated_into_an_upstream_path() -> None:
    config = parse_config({"routes": [{"name": "keyed", "upstream": {
        "url": "http://127.0.0.1:9/relay/${env.TOKEN}/v1", "protocol": "openai"}}]}, environ={"TOKEN": SECRET})
    proxy = TestServer(create_app(config))
    await proxy.start_server()
    try:
        async with aiohttp.ClientSession() as session, session.get(proxy.make_url("/speculoos/status")) as response:
            assert response.status == 200
            text = await response.text()
            status = await response.json()
    finally:
        await proxy.close()
    assert SECRET not in text
    assert status["routes"][0]["upstream"] == "http://127.0.0.1:9/…"
