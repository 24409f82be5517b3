"""A route's controller learns only from the requests it chose: rounds a client forced or pinned leave it alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.control.costs import RouteCosts
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
