"""A route whose upstream was down at start-up: requests share one tokenizer check, and after a failure wait out a
backoff that doubles, instead of each request probing the upstream again."""

from __future__ import annotations

import asyncio

from proxy.config.load import parse_config
from proxy.config.speculation import FallbackConfig
from proxy.control.route import RouteController
from proxy.errors import UpstreamUnavailableError
from proxy.server.runtime import FIRST_BACKOFF_S, PENDING, RouteRuntime
from proxy.targets.upstream import Timeouts, Upstream


class DownTarget:
    """A target whose probe fails after a moment, counting its calls."""

    def __init__(self) -> None:
        self.probes = 0

    async def probe(self) -> None:
        self.probes += 1
        await asyncio.sleep(0.05)
        raise UpstreamUnavailableError("upstream unreachable: refused")


async def test_requests_share_one_check_and_then_back_off() -> None:
    now = [100.0]
    route = parse_config({"routes": [{"name": "r", "upstream": {"url": "http://127.0.0.1:9"}}]}).routes[0]
    upstream = Upstream("http://127.0.0.1:9", Timeouts())
    target = DownTarget()
    runtime = RouteRuntime(route, upstream, RouteController(FallbackConfig(), 4), target=target,  # type: ignore[arg-type]
                           drafter=object(), clock=lambda: now[0])  # type: ignore[arg-type]
    try:
        answers = await asyncio.gather(*(runtime.tokenizer_problem() for _ in range(15)))
        assert answers == [PENDING] * 15 and target.probes == 1  # fifteen requests, one probe
        assert await runtime.tokenizer_problem() == PENDING and target.probes == 1  # within the backoff: none
        now[0] += FIRST_BACKOFF_S
        assert await runtime.tokenizer_problem() == PENDING and target.probes == 2  # past it: one more
        now[0] += FIRST_BACKOFF_S
        assert await runtime.tokenizer_problem() == PENDING and target.probes == 2  # the backoff doubled
        now[0] += FIRST_BACKOFF_S
        assert await runtime.tokenizer_problem() == PENDING and target.probes == 3
    finally:
        await upstream.close()
