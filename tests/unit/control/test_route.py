"""A route's decision: from its own α, probes from passthrough, and the status JSON."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from proxy.config.schema import FallbackConfig
from proxy.control.costs import Calibration
from proxy.control.policy import MIN_ROUNDS_BEFORE_SWITCH, Choice
from proxy.control.route import ALPHA_NOT_MEASURED, ROUTE_ROUNDS_TO_JUDGE, RouteController
from proxy.decode.decision import Read, Speculate, model_k
from tests.unit.control.test_costs import feed_rounds, round_event


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def controller(**settings: float) -> tuple[RouteController, Clock]:
    clock = Clock()
    return RouteController(FallbackConfig(**settings), configured_k=4, clock=clock), clock


def test_passthrough_probes_again_by_requests_and_by_time() -> None:
    c, clock = controller(probe_every_requests=3, probe_every_seconds=60)
    feed_rounds(c.costs, 4, 0, 0.01, 0.01, n=MIN_ROUNDS_BEFORE_SWITCH)
    c.record_plain(10, 1.0)
    assert c.decide().k == 0
    verdicts = [c.start_request()[0] for _ in range(3)]
    assert verdicts == [False, False, True]  # every third request probes
    clock.now += 61
    assert c.start_request() == (True, "probing speculation again")  # and after 60 s whatever the count


def test_speculating_route_measures_passthrough_once() -> None:
    c, _ = controller()
    assert c.start_request()[0] is True  # nothing measured: speculate with the configured k
    feed_rounds(c.costs, 4, 3, 0.01, 0.05, n=MIN_ROUNDS_BEFORE_SWITCH)
    assert c.start_request() == (False, "measuring the passthrough rate")
    c.record_plain(20, 2.0)
    assert c.start_request()[0] is True


def test_rounds_move_the_routes_decision_by_the_routes_alpha() -> None:
    c, _ = controller(min_acceptance=0.3, ewma_weight=0.5)
    for index in range(MIN_ROUNDS_BEFORE_SWITCH):
        c.observe(round_event(index, 4, 0))
    assert c.current.k == 0 and "min_acceptance" in c.current.reason
    assert c.status()["mode"] == "passthrough"


def test_a_passthrough_measurement_does_not_flip_the_route() -> None:
    c, _ = controller(min_acceptance=0.3)
    feed_rounds(c.costs, 4, 0, 0.01, 0.01, n=MIN_ROUNDS_BEFORE_SWITCH)
    c.decide()
    c.record_plain(100, 100.0)
    assert c.current.k == 0


def test_status_is_json_friendly() -> None:
    c, _ = controller()
    feed_rounds(c.costs, 4, 3, 0.01, 0.05)
    status = c.status()
    assert json.loads(json.dumps(status))["mode"] == "speculative"
    assert status["alpha"] == pytest.approx(0.75)


def test_a_route_that_looks_up_lets_every_request_decide_per_round() -> None:
    controller = RouteController(FallbackConfig(), configured_k=4, looks_up=True)
    controller.current = Choice(0, "speculation predicted 5 tok/s at k=1 vs 7 tok/s plain")
    speculate, why = controller.start_request()
    assert speculate and "per round" in why and "7 tok/s plain" in why
    assert controller.status()["mode"] == "speculative"


def test_a_route_that_looks_up_explores_a_model_it_turned_off_only_at_probes() -> None:
    controller = RouteController(FallbackConfig(probe_every_requests=3), configured_k=4, looks_up=True)
    controller.current = Choice(0, "speculation predicted 5 tok/s at k=1 vs 7 tok/s plain")
    controller.costs.record_plain(tokens=70, seconds=10.0)
    ks = [model_k(controller.policy().decide()) for _ in range(6)]
    assert ks == [0, 0, 4, 0, 0, 4]  # every third request tries the model again


def test_a_route_that_looks_up_has_a_model_it_turned_off_read_along_only_at_probes() -> None:
    controller = RouteController(FallbackConfig(probe_every_requests=3), configured_k=4, looks_up=True)
    controller.current = Choice(0, "speculation predicted 5 tok/s at k=1 vs 7 tok/s plain")
    controller.costs.record_plain(tokens=70, seconds=10.0)
    policies = [controller.policy(reads_along=True) for _ in range(3)]
    assert [p.model_may_pay() for p in policies] == [False, False, True]  # reading is exploring: the probe reads
    assert [isinstance(p.decide(), Read) for p in policies] == [False, False, True]


@pytest.mark.parametrize(("accepted", "wait_s", "rounds", "reason"), [
    # Every draft accepted, the round waiting 0.95 s for the model: one round shows the model cannot pay.
    (4, 0.95, 1, "even accepting every draft, drafting ran at 4.8 tok/s vs 10.0 tok/s plain"),
    # Half accepted: the rounds' time could pay (12.5 tok/s all accepted), their acceptance did not (7.5 tok/s).
    (2, 0.31, ROUTE_ROUNDS_TO_JUDGE, "drafting ran at 7.5 tok/s vs 10.0 tok/s plain"),
    (2, 0.31, ROUTE_ROUNDS_TO_JUDGE - 1, None),  # too few rounds to judge acceptance
    (2, 0.0, ROUTE_ROUNDS_TO_JUDGE, None),  # control: the rounds ran as their parts predict
])
def test_a_route_turns_the_model_off_once_its_rounds_ran_slower_than_plain(accepted: int, wait_s: float, rounds: int,
                                                                            reason: str | None) -> None:
    c, _ = controller()
    c.record_plain(10, 1.0)  # 10 tok/s
    for index in range(1, rounds + 1):  # 10 ms a token drafting and 0.05 s verifying
        event = round_event(index, 4, accepted, draft_s=0.04 + wait_s, verify_s=0.05)
        c.observe(replace(event, drafting_seconds_per_token=0.01))
    assert c.costs.speculative_rate(4) > 2 * 10.0  # the parts predict a win either way
    assert (c.current.k == 0) == (reason is not None), c.current
    if reason is not None:
        assert c.current.reason == reason


def test_a_route_decides_from_its_calibration_before_any_request() -> None:
    """Timed at start-up: where every draft accepted would still lose, the model is off before anyone pays a round."""
    for verify_s, draft_s, off in ((0.5, 0.05, True), (0.06, 0.01, False)):  # plain: 20 tok/s
        c, _ = controller()
        c.calibrated(Calibration(64, 0.05, ((1, verify_s), (4, verify_s), (8, verify_s)), draft_s))
        assert c.costs.plain_rate == pytest.approx(20.0) and c.costs.draft_per_token.value == draft_s
        assert c.costs.verify_time(4) == verify_s and c.costs.alpha.samples == 0  # acceptance is left to requests
        assert (c.current.k == 0) == off, c.current
        assert ("even accepting every draft" in c.current.reason) == off
        if not off:  # no prior α decides: the first request explores at the configured k
            assert c.current == Choice(4, ALPHA_NOT_MEASURED)
        assert json.loads(json.dumps(c.status()))["calibration"]["context"] == 64


def test_a_forced_request_drafts_at_the_configured_k_and_verifies_lookup_paths_in_full() -> None:
    c, _ = controller()
    c.calibrated(Calibration(64, 0.05, ((1, 0.5), (4, 0.5)), 0.05))  # the costs say plain decoding wins
    policy = c.policy(forced=True)
    for index in range(6):
        assert policy.decide() == Speculate(4, "k=4: speculation forced by the client")
        policy.observe(round_event(index, 4, 0))
    assert policy.lookup_length([0.9] * 32, 0, policy.decide()) == 32
    assert policy.model_may_pay()
