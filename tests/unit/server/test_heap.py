"""The garbage collector while the proxy serves: start-up's objects frozen, the young generation collected less
often, and both as they were once the app closes."""

from __future__ import annotations

import gc

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.config.load import parse_config
from proxy.server import heap
from proxy.server.app import create_app


def test_a_settled_heap_freezes_what_exists_and_collects_the_young_less_often_until_undone() -> None:
    before = gc.get_threshold()
    held = {"made": ["before settling"]}
    with heap.settled():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, *before[1:])
        assert gc.is_tracked(held) and not any(o is held for o in gc.get_objects())  # frozen: out of its sight
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    assert any(o is held for o in gc.get_objects())


def test_a_settled_heap_is_undone_when_what_it_wraps_fails() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), heap.settled():
        raise RuntimeError("a start-up that failed")
    assert (gc.get_threshold(), gc.get_freeze_count()) == (before, 0)


@pytest.mark.parametrize("settle", [True, False])
async def test_the_app_settles_the_heap_only_when_asked_and_only_while_it_serves(settle: bool) -> None:
    route = {"name": "plain", "upstream": {"url": "http://127.0.0.1:9", "protocol": "openai"}}
    config = parse_config({"routes": [route]})
    before = gc.get_threshold()
    proxy = TestServer(create_app(config, settle_heap=settle))
    await proxy.start_server()
    try:
        async with aiohttp.ClientSession() as session, session.get(proxy.make_url("/speculoos/status")) as response:
            assert response.status == 200
        serving = gc.get_threshold()[0], gc.get_freeze_count() > 0
    finally:
        await proxy.close()
    assert serving == ((heap.YOUNG_THRESHOLD, True) if settle else (before[0], False))
    assert (gc.get_threshold(), gc.get_freeze_count()) == (before, 0)
