"""The route's measurements: EWMAs, what they predict through the cost model, and assumed costs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from proxy.config.speculation import AssumedCostsConfig, FallbackConfig
from proxy.control.assumed_costs import AssumedCosts
from proxy.control.cost_model import expected_tokens
from proxy.control.cost_scale import COST_SCALE_ENV, cost_scale_from_env
from proxy.control.costs import Calibration, Ewma, RouteCosts
from proxy.control.policy import choose_k
from proxy.decode.events import PlainEvent, ReadEvent, RoundEvent
from tests.unit.control.rounds import played


def feed_rounds(costs: RouteCosts, k: int, accepted: int, draft_s: float, verify_s: float, n: int = 10) -> None:
    for _ in range(n):
        costs.record_round(played(k, accepted, draft_s, verify_s))


def test_verification_cost_is_fitted_across_k() -> None:
    costs = RouteCosts(0.1, 8)
    feed_rounds(costs, 2, 2, 0.02, 0.30)
    assert costs.verify_time(5) == pytest.approx(0.30 * 6 / 3)  # one point: cost grows with tokens evaluated
    feed_rounds(costs, 4, 4, 0.04, 0.50)
    assert costs.verify_time(6) == pytest.approx(0.70)  # two points: the line through them
    assert costs.verify_time(4) == pytest.approx(0.50)


def test_verification_cost_between_measured_k_follows_its_neighbours_not_the_line() -> None:
    costs = RouteCosts(0.1, 32)
    for k, seconds in [(1, 0.10), (4, 0.23), (7, 0.43), (12, 0.62), (25, 1.00)]:  # as measured on a CPU
        feed_rounds(costs, k, k, 0.0, seconds)
    assert costs.verify_time(8) == pytest.approx(0.43 + (0.62 - 0.43) / 5)  # the line through all: 0.41
    assert costs.verify_time(32) > costs.verify_time(25)  # beyond them: the line


def test_an_ewma_starts_as_the_mean_of_its_first_observations() -> None:
    ewma = Ewma(0.1)
    for x in (1.0, 2.0, 3.0):
        ewma.add(x)
    assert ewma.value == pytest.approx(2.0)  # a noisy first observation weighs no more than the next ones
    for _ in range(7):
        ewma.add(2.0)
    ewma.add(12.0)  # the eleventh: from the tenth on, a new observation weighs 0.1
    assert ewma.value == pytest.approx(3.0)


def round_event(index: int, drafted: int, accepted: int, draft_s: float = 0.04, verify_s: float = 0.2) -> RoundEvent:
    return RoundEvent(request_id="r", route="route", index=index, k=drafted, drafted=tuple(range(1, drafted + 1)),
                      accepted=accepted, emitted=tuple(range(accepted + 1)), draft_seconds=draft_s,
                      verify_seconds=verify_s)


def test_model_rounds_are_timed_as_they_ran_without_lookups_or_the_prefill() -> None:
    costs = RouteCosts(0.5, 8)
    costs.observe(round_event(0, 4, 4, draft_s=9.0))  # paid the prefill
    costs.observe(replace(round_event(1, 4, 4, draft_s=9.0), source="lookup"))
    assert costs.model_rounds_run() == (0, None)
    costs.observe(round_event(2, 4, 4, draft_s=0.3, verify_s=0.2))  # 5 tokens in 0.5 s
    costs.observe(round_event(3, 4, 1, draft_s=0.1, verify_s=0.1))  # 2 tokens in 0.2 s
    assert costs.model_rounds_run() == (2, pytest.approx(3.5 / 0.35))


def test_events_feed_the_measurements_and_the_first_round_pays_no_costs() -> None:
    costs = RouteCosts(0.5, 8)
    costs.observe(round_event(0, 4, 2, draft_s=9.0, verify_s=9.0))  # the prefill round: α only
    assert costs.alpha.value == pytest.approx(0.5) and costs.draft_per_token.value is None and not costs.verify_by_k
    costs.observe(round_event(1, 4, 4))
    assert costs.alpha.value == pytest.approx(0.75)
    assert costs.draft_per_token.value == pytest.approx(0.01) and costs.verify_time(4) == pytest.approx(0.2)
    assert [e.value for e in costs.alpha_per_position[:4]] == pytest.approx([1.0, 1.0, 0.5, 0.5])
    costs.observe(PlainEvent("r", "route", (1, 2, 3), 0.3))  # too short to say much about the rate
    assert costs.plain_rate is None
    costs.observe(PlainEvent("r", "route", (1, 2, 3, 4, 5, 6, 7, 8), 0.4))
    assert costs.plain_rate == pytest.approx(20.0)


def test_chunks_decoded_while_the_draft_read_along_measure_the_reading_not_the_plain_rate() -> None:
    costs = RouteCosts(1.0, 8)
    costs.observe(PlainEvent("r", "route", tuple(range(8)), 1.0, draft_busy=True))  # 8 tok/s while reading
    assert costs.plain_rate is None and costs.reading_slowdown() is None
    costs.observe(PlainEvent("r", "route", tuple(range(8)), 0.8))  # 10 tok/s alone
    assert costs.plain_rate == pytest.approx(10.0) and costs.reading_slowdown() == pytest.approx(0.2)
    costs.record_plain(8, 0.8, draft_busy=True)  # a draft on a device of its own costs the target nothing
    assert costs.plain_rate == pytest.approx(10.0) and costs.reading_slowdown() == pytest.approx(0.0)


def test_a_first_round_after_plain_chunks_pays_no_prefill_and_measures_the_costs() -> None:
    costs = RouteCosts(0.5, 8)
    costs.observe(replace(round_event(0, 4, 2), prefill=False))
    assert costs.draft_per_token.value == pytest.approx(0.01) and costs.verify_time(4) == pytest.approx(0.2)


@pytest.mark.parametrize(("timed", "expected"), [(0.01, 0.01), (None, 1.2 / 4)])
def test_the_drafts_speed_is_its_drafting_not_its_reading(timed: float | None, expected: float) -> None:
    """A model draft after lookup rounds first reads what it missed: 1.2 s for 4 tokens drafted in 0.04 s."""
    costs = RouteCosts(1.0, 8)
    costs.observe(replace(round_event(3, 4, 4, draft_s=1.2), drafting_seconds_per_token=timed))
    assert costs.draft_per_token.value == pytest.approx(expected)  # untimed: the round's draft time stands


def test_speculative_rate_uses_the_given_alpha_or_the_routes_survival() -> None:
    costs = RouteCosts(1.0, 8)
    assert costs.speculative_rate(4) is None  # nothing measured
    costs.record_round(played(4, 2, draft_seconds=0.04, verify_seconds=0.06))
    assert costs.speculative_rate(4) == pytest.approx(3 / 0.1)  # the first 2 always accepted, never more
    assert costs.speculative_rate(4, alpha=0.5) == pytest.approx(expected_tokens(0.5, 4) / 0.1)
    assert costs.speculative_rate(4, alpha=1.0) == pytest.approx(5 / 0.1)
    assert costs.speculative_rate(4, curve=[0.9, 0.8, 0.7, 0.6]) == pytest.approx(4.0 / 0.1)


def test_the_hit_rate_is_the_survival_of_all_k_times_the_guess() -> None:
    costs = RouteCosts(1.0, 8)
    assert costs.hit_rate([0.9, 0.8, 0.6]) == pytest.approx(0.6 * 0.6 / 0.8)  # guess as likely as the last draft
    costs.observe(RoundEvent(request_id="r", route="route", index=1, k=2, drafted=(5, 6), accepted=2, emitted=(5, 6, 7),
                             draft_seconds=0.1, verify_seconds=0.2, ahead_hit=False))
    assert costs.hit_rate([0.9, 0.8, 0.6]) == 0.0  # measured: the one guess after an all-accepted round missed


def test_pipelining_raises_the_predicted_rate() -> None:
    costs = RouteCosts(0.1, 8)
    feed_rounds(costs, 4, 4, 0.2, 0.4)
    feed_rounds(costs, 4, 3, 0.2, 0.4)
    assert costs.speculative_rate(4, pipelined=True) > costs.speculative_rate(4, pipelined=False)
    assert costs.speculative_rate(4) == costs.speculative_rate(4, pipelined=False)  # as the route says: off


def test_verification_time_follows_the_context_when_the_server_reevaluates_it() -> None:
    costs = RouteCosts(0.1, 8)
    for context in range(100, 1700, 50):  # 1 ms per 100 tokens of context, on top of 0.2 s
        costs.record_round(played(4, 4, 0.1, 0.2 + context / 100_000, context=context))
    assert costs.context_slope == pytest.approx(1e-5)
    assert costs.verify_time(4, 3000) - costs.verify_time(4, 1000) == pytest.approx(0.02)


def test_a_cached_context_or_too_little_spread_adds_nothing() -> None:
    flat, narrow = RouteCosts(0.1, 8), RouteCosts(0.1, 8)
    for context in range(100, 1700, 50):
        flat.record_round(played(4, 4, 0.1, 0.2, context=context))
        narrow.record_round(played(4, 4, 0.1, 0.2 + context / 1000, context=500 + context % 3))
    assert flat.context_slope == 0.0 and narrow.context_slope == 0.0
    assert flat.verify_time(4, 5000) == pytest.approx(0.2)


def test_a_read_chunk_teaches_the_route_as_one_round() -> None:
    costs = RouteCosts(1.0, 4)  # weight 1: the estimates are the last observation
    costs.observe(ReadEvent("r", "route", (1, 2, 3, 4), (1, 2, 0, 4)))  # the draft agreed: y y n y
    # Starts 0..3: runs of 2, 1, 0, 1; position j is reached by 4 - j starts.
    assert [e.value for e in costs.alpha_per_position] == [3 / 4, 1 / 3, 0.0, 0.0]
    assert costs.alpha.value == pytest.approx((3 / 4 + 1 / 3) / 4)
    assert costs.alpha.samples == 1


GPU_REGIME = AssumedCostsConfig(draft_ms=4, verify_ms_flat=25, plain_ms=25, rtt_ms=2)
CPU_REGIME = AssumedCostsConfig(draft_ms=60, verify_ms_per_token=60, plain_ms=60)


def test_assumed_costs_ignore_what_is_measured_but_not_acceptance() -> None:
    costs = AssumedCosts(0.5, 8, GPU_REGIME)
    costs.observe(replace(round_event(1, 4, 2, draft_s=9.0, verify_s=9.0), prefill=False))
    costs.observe(PlainEvent("r", "route", tuple(range(20)), 40.0))
    assert costs.alpha.value == pytest.approx(0.5)  # acceptance is real
    assert costs.draft_per_token.value == pytest.approx(0.004) and costs.plain_rate == pytest.approx(40.0)
    assert costs.verify_time(1) == costs.verify_time(32) == pytest.approx(0.027)  # flat, with the round trip
    assert AssumedCosts(0.5, 8, CPU_REGIME).verify_time(4) == pytest.approx(0.3)  # 5 tokens evaluated


@pytest.mark.parametrize(("assumed", "k"), [(GPU_REGIME, 5), (CPU_REGIME, 0)])
def test_assumed_costs_decide_k_as_that_hardware_would(assumed: AssumedCostsConfig, k: int) -> None:
    costs = AssumedCosts(0.1, 8, assumed)
    settings = FallbackConfig(assume_costs=assumed)
    decision = choose_k(costs, settings, 4, alpha=0.8, alpha_rounds=10, speculating=True)
    assert decision.k == k  # flat verification: K up to where draft tokens stop paying; K + 1 steps: none


# -- the test cost scale ------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "scale"), [(None, 1.0), ("", 1.0), ("2", 2.0), (" 0.5 ", 0.5)])
def test_the_cost_scale_comes_from_the_environment(value: str | None, scale: float) -> None:
    assert cost_scale_from_env({} if value is None else {COST_SCALE_ENV: value}) == scale


@pytest.mark.parametrize("value", ["0", "-1", "fast", "nan", "inf"])
def test_a_cost_scale_that_is_not_a_positive_number_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match=f"{COST_SCALE_ENV} must be a positive number"):
        cost_scale_from_env({COST_SCALE_ENV: value})


def test_the_cost_scale_multiplies_speculations_costs_not_plain_decodings() -> None:
    plain, scaled = RouteCosts(0.5, 8), RouteCosts(0.5, 8, scale=2.0)
    calibration = Calibration(32, 0.05, ((1, 0.1), (8, 0.4)), 0.02)
    for costs in (plain, scaled):
        costs.seed(calibration)
        costs.observe(round_event(1, 4, 4, draft_s=0.3, verify_s=0.2))
        costs.observe(PlainEvent("r", "route", (1, 2, 3, 4), 0.2))
    assert scaled.verify_time(8) == pytest.approx(2 * plain.verify_time(8))
    assert scaled.draft_per_token.value == pytest.approx(2 * plain.draft_per_token.value)
    assert scaled.model_rounds_run()[1] == pytest.approx(plain.model_rounds_run()[1] / 2)
    assert scaled.plain_rate == pytest.approx(plain.plain_rate)  # what speculation competes with stays as measured


def test_assumed_costs_ignore_the_cost_scale() -> None:
    """A test that pins its costs decides the same on every machine and under every scale."""
    config = AssumedCostsConfig(draft_ms=4, verify_ms_flat=25, plain_ms=25)
    costs = AssumedCosts(0.1, 8, config)
    costs.observe(round_event(1, 4, 4, draft_s=30.0, verify_s=30.0))
    assert costs.verify_time(4) == pytest.approx(0.025) and costs.scale == 1.0
