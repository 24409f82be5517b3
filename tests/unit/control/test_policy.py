"""The controller's maths and decisions, from constructed measurements (no models, no I/O)."""

from __future__ import annotations

import pytest

from proxy.config.schema import FallbackConfig
from proxy.control.policy import MIN_ROUNDS_BEFORE_SWITCH, RouteController, expected_tokens


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def controller(**settings: float) -> tuple[RouteController, Clock]:
    clock = Clock()
    return RouteController(FallbackConfig(**settings), configured_k=4, clock=clock), clock


@pytest.mark.parametrize(("alpha", "k", "expected"), [
    (0.0, 4, 1.0),  # every draft rejected: only the target's token
    (1.0, 4, 5.0),  # all accepted plus the bonus
    (0.5, 1, 1.5),
    (0.5, 3, 1.875),  # (1 - 0.5^4) / 0.5
    (0.8, 4, (1 - 0.8**5) / 0.2),
])
def test_expected_tokens_per_round(alpha: float, k: int, expected: float) -> None:
    assert expected_tokens(alpha, k) == pytest.approx(expected)


def feed_rounds(c: RouteController, k: int, accepted: int, draft_s: float, verify_s: float, n: int = 10) -> None:
    for _ in range(n):
        c.record_round(k, accepted, draft_s, verify_s)


def test_verification_cost_is_fitted_across_k() -> None:
    c, _ = controller()
    feed_rounds(c, 2, 2, 0.02, 0.30)
    assert c.verify_time(5) == pytest.approx(0.30 * 6 / 3)  # one point: cost grows with tokens evaluated
    feed_rounds(c, 4, 4, 0.04, 0.50)
    assert c.verify_time(6) == pytest.approx(0.70)  # two points: the line through them
    assert c.verify_time(4) == pytest.approx(0.50)


def test_cpu_like_costs_choose_passthrough() -> None:
    """Draft half a target step, verification steep in K (this machine's Qwen pair): speculation loses."""
    c, _ = controller(k_min=1, k_max=8)
    feed_rounds(c, 4, 2, draft_s=4 * 0.045, verify_s=0.19)
    feed_rounds(c, 2, 1, draft_s=2 * 0.045, verify_s=0.13)
    c.record_plain(tokens=100, seconds=100 * 0.085)
    decision = c.decide()
    assert decision.k == 0 and "plain" in decision.reason
    assert decision.plain_rate == pytest.approx(1 / 0.085)


def test_gpu_like_costs_choose_a_large_k() -> None:
    """Flat verification and a cheap draft: speculation pays, more so at larger K when α is high."""
    c, _ = controller(k_min=1, k_max=8)
    feed_rounds(c, 4, 4, draft_s=4 * 0.002, verify_s=0.030)
    feed_rounds(c, 2, 2, draft_s=2 * 0.002, verify_s=0.030)
    c.record_plain(tokens=100, seconds=100 * 0.030)
    decision = c.decide()
    assert decision.k == 8
    assert decision.predicted_rate > decision.plain_rate


def test_low_acceptance_falls_back_even_before_plain_is_measured() -> None:
    c, _ = controller(min_acceptance=0.3)
    feed_rounds(c, 4, 0, 0.01, 0.01, n=MIN_ROUNDS_BEFORE_SWITCH)
    decision = c.decide()
    assert decision.k == 0 and "min_acceptance" in decision.reason


def test_hysteresis_keeps_the_current_mode_near_the_break_even_point() -> None:
    c, _ = controller(k_min=4, k_max=4, hysteresis=0.1)
    feed_rounds(c, 4, 4, draft_s=0.0, verify_s=5 / 10.0)  # 10 tok/s speculative
    c.record_plain(tokens=10, seconds=10 / 10.5)  # 10.5 tok/s plain: within 10 % of speculative
    assert c.decide().k == 4  # speculating: stays until plain beats it by the margin
    c.current = c.current.__class__(0, "forced for the test")
    assert c.decide().k == 0  # in passthrough: stays until speculation beats plain by the margin


def test_passthrough_probes_again_by_requests_and_by_time() -> None:
    c, clock = controller(probe_every_requests=3, probe_every_seconds=60)
    feed_rounds(c, 4, 0, 0.01, 0.01, n=MIN_ROUNDS_BEFORE_SWITCH)
    c.record_plain(10, 1.0)
    assert c.decide().k == 0
    verdicts = [c.start_request()[0] for _ in range(3)]
    assert verdicts == [False, False, True]  # every third request probes
    clock.now += 61
    assert c.start_request() == (True, "probing speculation again")  # and after 60 s whatever the count


def test_speculating_route_measures_passthrough_once() -> None:
    c, _ = controller()
    assert c.start_request()[0] is True  # nothing measured: speculate with the configured k
    feed_rounds(c, 4, 3, 0.01, 0.05, n=MIN_ROUNDS_BEFORE_SWITCH)
    assert c.start_request() == (False, "measuring the passthrough rate")
    c.record_plain(20, 2.0)
    assert c.start_request()[0] is True


def test_status_is_json_friendly() -> None:
    import json

    c, _ = controller()
    feed_rounds(c, 4, 3, 0.01, 0.05)
    status = c.status()
    assert json.loads(json.dumps(status))["mode"] == "speculative"
    assert status["alpha"] == pytest.approx(0.75)


def test_a_request_decides_with_its_own_acceptance_rate() -> None:
    """A code-editing request (α = 1) keeps speculating on a route whose average α is low."""
    c, _ = controller(k_min=4, k_max=4, min_acceptance=0.3)
    feed_rounds(c, 4, 0, draft_s=0.0, verify_s=0.10)  # the route's α: 0
    c.record_plain(tokens=100, seconds=100 * 0.05)  # 20 tok/s plain
    assert c.decide().k == 0
    assert c.decide(request_alpha=1.0).k == 4  # 5 tokens per 0.1 s round: 50 tok/s
