"""Fixtures of the round loop's tests: each test runs against a fake SGLang and a fake vLLM serving a toy model."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer

from proxy.targets.upstream import Timeouts, Upstream
from tests.fakes.toy_model import ToyModel
from tests.unit.decode.harness import PROTOCOLS, Served


@pytest.fixture(params=sorted(PROTOCOLS))
def protocol(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def end_after() -> int | None:
    """Force the end token once the context holds this many tokens (None: never)."""
    return None


@pytest.fixture
async def served(protocol: str, end_after: int | None) -> AsyncIterator[Served]:
    model, wire = ToyModel(end_after=end_after), PROTOCOLS[protocol]
    app = wire.app(model)
    server = TestServer(app)
    await server.start_server()
    upstream = Upstream(str(server.make_url("")), Timeouts(1.0, 5.0, 5.0))
    yield Served(wire, wire.client(upstream), model, app[wire.seen])
    await upstream.close()
    await server.close()
