"""The bench's predictions from a proxy's reported costs, and their agreement with the controller's."""

from __future__ import annotations

import json

import pytest

from proxy.bench.prediction import Costs, predicted_speedup, traced_rate
from proxy.config.speculation import FallbackConfig
from proxy.control.cost_model import sequential_rate
from proxy.control.costs import RouteCosts
from proxy.control.route import RouteController
from tests.unit.control.rounds import played


@pytest.mark.parametrize(("alpha", "k", "draft", "verify", "plain_rate", "share", "expected"), [
    (0.5, 2, 0.01, 0.05, 20.0, 1.0, 1.25),  # E = 1.75 tokens per 0.07 s = 25 tok/s
    (1.0, 4, 0.0, 0.1, 10.0, 1.0, 5.0),  # every draft accepted: k + 1 tokens per round
    (0.0, 3, 0.01, 0.05, 20.0, 1.0, 12.5 / 20.0),  # nothing accepted: one token per round
    (0.5, 2, 0.01, 0.05, 20.0, 0.5, 1.0 / (0.5 / 25.0 + 0.5 / 20.0) / 20.0),  # half the tokens plain
    (0.5, 2, 0.01, 0.05, 20.0, 0.0, 1.0),
])
def test_predicted_speedup(alpha: float, k: int, draft: float, verify: float, plain_rate: float, share: float,
                           expected: float) -> None:
    costs = Costs(draft, {k: verify}, None)
    assert predicted_speedup(alpha, k, costs, plain_rate, share) == pytest.approx(expected)


def test_prediction_matches_the_controllers_rate_through_the_status_json() -> None:
    controller = RouteController(FallbackConfig(), configured_k=2)
    controller.costs.record_round(played(2, 1, draft_seconds=0.02, verify_seconds=0.05))
    controller.costs.record_round(played(4, 3, draft_seconds=0.04, verify_seconds=0.09))
    costs = Costs.from_status(json.loads(json.dumps(controller.status())))  # K keys become strings
    assert costs.verify_seconds_by_k == {2: pytest.approx(0.05), 4: pytest.approx(0.09)}
    alpha = controller.costs.alpha.value
    for k in (2, 4):
        assert sequential_rate(alpha, k, costs.draft_seconds_per_token, costs.verify_seconds(k)) == \
            pytest.approx(controller.costs.speculative_rate(k, alpha))


@pytest.mark.parametrize(("measured", "k", "expected"), [
    ({1: 0.1, 3: 0.3}, 3, 0.3),
    ({1: 0.1, 3: 0.3}, 2, 0.2),  # between the measured K
    ({1: 0.1, 3: 0.3}, 2.5, 0.25),  # auto mode's mean K
    ({1: 0.1, 2: 0.2, 3: 0.3, 8: 5.0}, 2.5, 0.25),  # between neighbours: a slow outlier far away does not count
    ({1: 0.1, 2: 0.2}, 4, 0.4),  # beyond the measured K: along the line
    ({2: 0.2}, 4, 0.2 * 5 / 3),  # one point: scaled by the tokens evaluated, as the controller does
    ({1: 0.3, 2: 0.2}, 8, 1e-6),  # a falling line: never free, as the controller clamps it
    ({}, 1, None),
])
def test_verify_seconds(measured: dict, k: float, expected: float | None) -> None:
    assert Costs(0.01, measured, None).verify_seconds(k) == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize("measured", [
    {2: 0.2},
    {1: 0.1, 4: 0.23, 7: 0.43, 12: 0.62, 25: 1.00},
    {2: 0.3, 4: 0.25},
])
@pytest.mark.parametrize("k", [0, 1, 3, 6, 20, 32])
def test_the_bench_predicts_verification_as_the_controller_does(measured: dict, k: int) -> None:
    route = RouteCosts(1.0, 8)
    for drafted, seconds in measured.items():
        route.record_round(played(drafted, drafted, 0.01, seconds))
    reported = Costs.from_status({"verify_seconds_by_k": {str(kk): e.value for kk, e in route.verify_by_k.items()}})
    assert reported.verify_seconds(k) == pytest.approx(route.verify_time(k), rel=1e-9, abs=1e-12)


def test_traced_rate_replays_each_round_at_its_own_k() -> None:
    costs = Costs(0.02, {1: 0.1, 16: 0.4}, None)
    lookup_only = {"round_trace": [[16, 16], [1, 0]], "plain_tokens": 4, "drafts": {"lookup": {"drafted": 17}}}
    assert traced_rate([lookup_only], costs, plain_rate=10.0) == pytest.approx(22 / 0.9)
    with_model = {**lookup_only, "drafts": {"model": {"drafted": 5}}}
    assert traced_rate([with_model], costs, plain_rate=10.0) == pytest.approx(22 / (0.9 + 5 * 0.02))
    assert traced_rate([{"round_trace": []}], costs, plain_rate=10.0) is None
    one_k = Costs(None, {4: 0.2}, None)  # one K: the others scaled by the tokens evaluated
    assert traced_rate([lookup_only], one_k, plain_rate=10.0) == pytest.approx(22 / (0.2 * 17 / 5 + 0.2 * 2 / 5 + 0.4))
    assert traced_rate([with_model], one_k, plain_rate=10.0) is None  # model drafts, but no draft time
    assert traced_rate([lookup_only], Costs(None, {}, None), plain_rate=10.0) is None  # no verification measured
