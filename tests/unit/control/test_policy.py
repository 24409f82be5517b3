"""Choosing K: the rule as a pure function, and a request's own policy."""

from __future__ import annotations

import pytest

from proxy.config.speculation import AssumedCostsConfig, FallbackConfig
from proxy.control.assumed_costs import AssumedCosts
from proxy.control.costs import Calibration, RouteCosts
from proxy.control.policy import (
    MEASURING,
    MIN_ROUNDS_BEFORE_SWITCH,
    MIN_ROUNDS_TO_JUDGE,
    MIN_TOKENS_TO_GIVE_UP,
    Choice,
    PinnedPolicy,
    RequestPolicy,
    choose_k,
)
from proxy.decode.decision import Measure, Plain, Read, Speculate, model_k
from proxy.decode.events import PlainEvent, ReadEvent
from tests.unit.control.test_costs import feed_rounds, round_event


def choose(costs: RouteCosts, settings: FallbackConfig, *, speculating: bool = True,
           alpha: float | None = None) -> Choice:
    alpha = costs.alpha.value if alpha is None else alpha
    return choose_k(costs, settings, 4, alpha=alpha, alpha_rounds=costs.alpha.samples, speculating=speculating)


def test_nothing_measured_speculates_with_the_configured_k() -> None:
    decision = choose(RouteCosts(0.1, 8), FallbackConfig())
    assert decision.k == 4 and "not measured" in decision.reason


def test_cpu_like_costs_choose_plain_decoding() -> None:
    """Draft half a target step, verification steep in K (this machine's Qwen pair): speculation loses."""
    costs = RouteCosts(0.1, 8)
    feed_rounds(costs, 4, 2, draft_s=4 * 0.045, verify_s=0.19)
    feed_rounds(costs, 2, 1, draft_s=2 * 0.045, verify_s=0.13)
    costs.record_plain(tokens=100, seconds=100 * 0.085)
    decision = choose(costs, FallbackConfig(k_min=1, k_max=8))
    assert decision.k == 0 and "plain" in decision.reason
    assert decision.plain_rate == pytest.approx(1 / 0.085)


def test_gpu_like_costs_choose_a_large_k() -> None:
    """Flat verification and a cheap draft: speculation pays, more so at larger K when α is high."""
    costs = RouteCosts(0.1, 8)
    feed_rounds(costs, 4, 4, draft_s=4 * 0.002, verify_s=0.030)
    feed_rounds(costs, 2, 2, draft_s=2 * 0.002, verify_s=0.030)
    costs.record_plain(tokens=100, seconds=100 * 0.030)
    decision = choose(costs, FallbackConfig(k_min=1, k_max=8))
    assert decision.k == 8 and decision.predicted_rate > decision.plain_rate


def test_low_acceptance_falls_back_even_before_plain_is_measured() -> None:
    costs = RouteCosts(0.1, 8)
    feed_rounds(costs, 4, 0, 0.01, 0.01, n=MIN_ROUNDS_BEFORE_SWITCH)
    decision = choose(costs, FallbackConfig(min_acceptance=0.3))
    assert decision.k == 0 and "min_acceptance" in decision.reason


def test_hysteresis_keeps_the_current_mode_near_the_break_even_point() -> None:
    costs = RouteCosts(0.1, 4)
    feed_rounds(costs, 4, 4, draft_s=0.0, verify_s=5 / 10.0)  # 10 tok/s speculative
    costs.record_plain(tokens=10, seconds=10 / 10.5)  # 10.5 tok/s plain: within 10 % of speculative
    settings = FallbackConfig(k_min=4, k_max=4, hysteresis=0.1)
    assert choose(costs, settings, speculating=True).k == 4  # stays until plain beats it by the margin
    assert choose(costs, settings, speculating=False).k == 0  # stays until speculation beats plain by the margin


def test_pinned_policy_never_changes() -> None:
    policy = PinnedPolicy(3)
    for index in range(10):
        policy.observe(round_event(index, 3, 0))
        assert model_k(policy.decide()) == 3


def route_with_low_alpha() -> tuple[RouteCosts, FallbackConfig]:
    costs = RouteCosts(0.1, 4)
    feed_rounds(costs, 4, 0, draft_s=0.0, verify_s=0.10)  # the route's α: 0
    costs.record_plain(tokens=100, seconds=100 * 0.05)  # 20 tok/s plain
    return costs, FallbackConfig(k_min=4, k_max=4, min_acceptance=0.3)


def test_a_request_decides_with_its_own_acceptance_rate() -> None:
    """A code-editing request (α = 1) keeps speculating on a route whose average α is low."""
    costs, settings = route_with_low_alpha()
    assert choose(costs, settings).k == 0
    policy = RequestPolicy(costs, settings, 4, Choice(4, "start"))
    for index in range(MIN_ROUNDS_BEFORE_SWITCH + 3):
        assert model_k(policy.decide()) == 4  # 5 tokens per 0.1 s round: 50 tok/s against 20 plain
        policy.observe(round_event(index, 4, 4))


def test_a_request_explores_before_it_may_switch() -> None:
    costs, settings = route_with_low_alpha()
    policy = RequestPolicy(costs, settings, 4, Choice(0, "route in passthrough"))
    ks = []
    for index in range(MIN_ROUNDS_BEFORE_SWITCH + 1):
        ks.append(model_k(policy.decide()))
        policy.observe(round_event(index, 4, 0))
    assert ks == [4] * MIN_ROUNDS_BEFORE_SWITCH + [0]  # a probe explores at the configured k, then decides


def test_a_request_never_writes_the_routes_measurements_or_decision() -> None:
    costs, settings = route_with_low_alpha()
    before = (costs.alpha.value, costs.alpha.samples)
    policy = RequestPolicy(costs, settings, 4, Choice(4, "start"))
    for index in range(8):
        policy.decide()
        policy.observe(round_event(index, 4, 4))
    assert (costs.alpha.value, costs.alpha.samples) == before


def test_a_fresh_route_measures_the_plain_rate_once_before_its_first_round() -> None:
    costs, settings = RouteCosts(0.1, 8), FallbackConfig()
    policy = RequestPolicy(costs, settings, 4, Choice(4, "not measured yet"))
    measure = policy.decide()
    assert measure == Measure(MEASURING)
    assert policy.decide() == measure  # asking again (to draft ahead, say) does not use it up
    prefill = PlainEvent("r", "route", tuple(range(4)), 4 * 0.5, prefill=True)  # carries the prompt: measures nothing
    policy.observe(prefill)
    assert policy.decide() == measure
    chunk = PlainEvent("r", "route", tuple(range(8)), 8 * 0.1)  # 10 tok/s plain
    costs.observe(chunk)
    policy.observe(chunk)
    for index in range(MIN_ROUNDS_BEFORE_SWITCH):
        assert model_k(policy.decide()) == 4  # perfect acceptance would pay (12.5 tok/s): it explores
        event = round_event(index + 1, 4, 0, draft_s=0.2, verify_s=0.2)
        costs.observe(event)
        policy.observe(event)
    decision = policy.decide()
    assert isinstance(decision, Plain)


def test_a_route_that_knows_its_plain_rate_measures_nothing() -> None:
    costs, settings = route_with_low_alpha()
    policy = RequestPolicy(costs, settings, 4, Choice(4, "start"))
    for index in range(MIN_ROUNDS_BEFORE_SWITCH + 2):
        assert not isinstance(policy.decide(), Measure)
        policy.observe(round_event(index, 4, 4))


def test_a_forced_request_drafts_at_its_k_whatever_the_costs_and_acceptance() -> None:
    policy = PinnedPolicy(4, "k=4: speculation forced by the client")
    for index in range(MIN_ROUNDS_BEFORE_SWITCH + 8):
        decision = policy.decide()
        assert decision == Speculate(4, "k=4: speculation forced by the client")
        policy.observe(round_event(index, 4, 0))
    assert policy.lookup_length([0.1] * 32, 0, decision) == 32


def read_event(agreed: str) -> ReadEvent:
    """A plain chunk the draft read: 'y' where its greedy choice was the target's token, 'n' where not."""
    tokens = tuple(range(len(agreed)))
    return ReadEvent("r", "route", tokens, tuple(t if a == "y" else t + 1 for t, a in zip(tokens, agreed)))


def test_a_read_chunk_counts_as_the_rounds_the_draft_would_have_made_from_each_token() -> None:
    costs, settings = route_with_low_alpha()
    policy = RequestPolicy(costs, settings, 4, Choice(4, "start"))
    policy.observe(read_event("yyny"))
    # Starts 0..3 reach position 0; runs of agreement from each start are 2, 1, 0, 1.
    assert policy.evidence.reached == [4, 3, 2, 1]
    assert policy.evidence.survived == [3, 1, 0, 0]
    assert (policy.evidence.drafted, policy.evidence.accepted, policy.evidence.reads) == (4, 3, 1)


def test_reading_decides_without_a_round_and_can_bring_drafting_back() -> None:
    """On a route where speculation pays at α = 1 and loses at α = 0, read chunks alone switch a request both ways."""
    costs = RouteCosts(0.1, 4)
    feed_rounds(costs, 4, 2, draft_s=0.0, verify_s=0.10)
    costs.record_plain(tokens=100, seconds=100 * 0.05)  # 20 tok/s plain; 5 tokens a 0.1 s round would be 50
    settings = FallbackConfig(k_min=4, k_max=4, min_acceptance=0.3)
    policy = RequestPolicy(costs, settings, 4, Choice(4, "start"))
    for _ in range(MIN_ROUNDS_BEFORE_SWITCH):
        policy.observe(read_event("nnnnnnnn"))
    assert model_k(policy.decide()) == 0 and policy.evidence.rounds == 0
    for _ in range(6):
        policy.observe(read_event("yyyyyyyy"))
    assert model_k(policy.decide()) == 4


def test_going_back_to_drafting_needs_a_clear_gain() -> None:
    costs = RouteCosts(0.1, 4)
    feed_rounds(costs, 4, 4, draft_s=0.0, verify_s=5 / 10.0)  # 10 tok/s speculative
    costs.record_plain(tokens=10, seconds=10 / 9.0)  # 9 tok/s plain: speculation 11 % ahead
    settings = FallbackConfig(k_min=4, k_max=4, hysteresis=0.05)
    assert choose_k(costs, settings, 4, alpha=1.0, alpha_rounds=9, speculating=False).k == 4
    assert choose_k(costs, settings, 4, alpha=1.0, alpha_rounds=9, speculating=False, resume_margin=0.2).k == 0
    assert choose_k(costs, settings, 4, alpha=1.0, alpha_rounds=9, speculating=True, resume_margin=0.2).k == 4


def test_a_request_that_reads_along_reads_before_its_first_round_unless_the_route_found_speculation_pays() -> None:
    costs, settings = route_with_low_alpha()
    fresh = RequestPolicy(RouteCosts(0.1, 4), settings, 4, Choice(4, "not measured"), reads_along=True)
    probe = RequestPolicy(costs, settings, 4, choose(costs, settings), reads_along=True)
    first = fresh.decide()
    assert isinstance(first, Measure)  # the draft reads that chunk too
    fresh.observe(PlainEvent("r", "route", tuple(range(8)), 0.4))
    for policy in (fresh, probe):
        for _ in range(MIN_ROUNDS_BEFORE_SWITCH):
            decision = policy.decide()
            assert isinstance(decision, Read)
            policy.observe(read_event("yyyyyyyy"))
        assert not isinstance(policy.decide(), Read)
    paying = Choice(4, "k=4 predicted 30 tok/s vs 20 plain", 30.0, 20.0)
    assert model_k(RequestPolicy(costs, settings, 4, paying, reads_along=True).decide()) == 4
    assert model_k(RequestPolicy(costs, settings, 4, Choice(4, "not measured")).decide()) == 4


def test_a_request_stops_exploring_once_even_accepting_every_draft_could_not_beat_plain_decoding() -> None:
    """One round measures the costs; where five tokens per round would still lose, a second round is waste."""
    settings = FallbackConfig(k_min=1, k_max=8)
    for verify_s, after in ((0.30, 0), (0.05, 4)):  # 5 tokens per 0.44 s against 20 tok/s plain; the control pays
        costs = RouteCosts(0.1, 8)
        costs.record_plain(tokens=100, seconds=100 * 0.05)
        policy = RequestPolicy(costs, settings, 4, Choice(4, "start"))
        assert model_k(policy.decide()) == 4
        event = round_event(1, 4, 4, draft_s=4 * 0.035, verify_s=verify_s)  # every draft accepted
        costs.observe(event)
        policy.observe(event)
        decision = policy.decide()
        assert model_k(decision) == after
        assert ("even accepting every draft" in decision.reason) == (after == 0)


@pytest.mark.parametrize(("chunk", "may_pay"), [
    ("ynnynnyn", False),  # the draft agrees on a third of the text: even optimistically it loses, reading stops
    ("yyyyyyyn", True),  # the control: agreement that could pay keeps it reading
])
def test_a_request_gives_the_model_draft_up_once_it_could_not_pay_even_optimistically(chunk: str,
                                                                                      may_pay: bool) -> None:
    costs = RouteCosts(0.1, 4)
    feed_rounds(costs, 4, 2, draft_s=0.0, verify_s=0.10)
    costs.record_plain(tokens=100, seconds=100 * 0.05)  # 20 tok/s plain; a round of 5 tokens in 0.1 s would be 50
    policy = RequestPolicy(costs, FallbackConfig(k_min=4, k_max=4), 4, Choice(4, "start"), reads_along=True)
    for _ in range(MIN_TOKENS_TO_GIVE_UP // len(chunk) - 1):
        policy.observe(read_event(chunk))
    assert policy.model_may_pay()  # too little read to give up
    for _ in range(6):
        policy.observe(read_event(chunk))
    assert policy.model_may_pay() == may_pay
    assert PinnedPolicy(4).model_may_pay()


@pytest.mark.parametrize(("round_s", "assumed", "drafts"), [
    (0.25, False, False),  # 4 tokens per 0.25 s ran at 16 tok/s against 20 plain: the model draft is given up
    (0.1, False, True),  # the control: rounds that ran as predicted (40 tok/s) go on
    (0.25, True, True),  # assumed costs describe other hardware: this machine's timings do not judge them
])
def test_a_request_gives_the_model_draft_up_once_its_rounds_ran_slower_than_plain(round_s: float, assumed: bool,
                                                                                   drafts: bool) -> None:
    costs = RouteCosts(0.1, 4)
    if assumed:
        costs = AssumedCosts(0.1, 4, AssumedCostsConfig(draft_ms=0, verify_ms_flat=100, plain_ms=50))
    feed_rounds(costs, 4, 4, draft_s=0.0, verify_s=0.10)  # what the rule predicts from: 50 tok/s
    costs.record_plain(tokens=100, seconds=100 * 0.05)  # 20 tok/s plain
    policy = RequestPolicy(costs, FallbackConfig(k_min=4, k_max=4), 4, Choice(4, "start"))
    for index in range(1, MIN_ROUNDS_TO_JUDGE + 1):
        assert model_k(policy.decide()) == 4
        # 3 of 4 accepted, as the rounds ran: accepting all 4 would have paid (20 tok/s), so it takes several rounds
        policy.observe(round_event(index, 4, 3, draft_s=round_s / 2, verify_s=round_s / 2))
    decision = policy.decide()
    assert (model_k(decision) == 4) == drafts and policy.model_may_pay() == drafts
    assert (decision.reason == "drafting ran at 16.0 tok/s vs 20.0 tok/s plain") == (not drafts)


@pytest.mark.parametrize(("round_s", "drafts"), [
    (0.5, False),  # 5 tokens in 0.5 s even had every draft been accepted: 10 tok/s against 20 plain
    (0.2, True),  # the control: 25 tok/s had every draft been accepted; one rejection says nothing yet
])
def test_a_request_stops_a_losing_model_draft_after_one_round(round_s: float, drafts: bool) -> None:
    costs = RouteCosts(0.1, 4)
    feed_rounds(costs, 4, 4, draft_s=0.0, verify_s=0.10)  # what the rule predicts from: 50 tok/s
    costs.record_plain(tokens=100, seconds=100 * 0.05)  # 20 tok/s plain
    policy = RequestPolicy(costs, FallbackConfig(k_min=4, k_max=4), 4, Choice(4, "start"))
    assert model_k(policy.decide()) == 4
    policy.observe(round_event(1, 4, 0, draft_s=round_s / 2, verify_s=round_s / 2))  # timed as it ran
    decision = policy.decide()
    assert (model_k(decision) == 4) == drafts and policy.model_may_pay() == drafts
    assert ("even accepting every draft, drafting ran at 10.0 tok/s" in decision.reason) == (not drafts)


def test_a_request_on_calibrated_costs_that_cannot_pay_never_drafts_or_reads() -> None:
    """Costs measured before the first round: where every draft accepted would lose, no round is spent to learn it."""
    for verify_s, drafts in ((0.5, False), (0.05, True)):
        costs = RouteCosts(0.1, 4)
        costs.seed(Calibration(64, 0.05, ((4, verify_s),), 0.01))  # 20 tok/s plain; all accepted: 8.5 or 59 tok/s
        policy = RequestPolicy(costs, FallbackConfig(k_min=4, k_max=4), 4, Choice(4, "start"))
        decision = policy.decide()
        assert (model_k(decision) == 4) == drafts and policy.model_may_pay() == drafts
        assert not isinstance(decision, Measure)  # the calibration measured the plain rate


@pytest.mark.parametrize(("reads_first", "max_tokens", "drafts"), [
    (500, 32, False),  # reading 500 tokens (5 s) first: 32 tokens would save 0.3 s at the expected acceptance
    (500, 256, False),  # ... 256 tokens 2.2 s (every draft accepted, they would save 8.7 s)
    (500, 2048, True),  # ... 2,048 tokens 18 s
    (0, 32, True),  # the model reads on cores of its own: the target never waits for it
])
def test_a_model_taking_turns_drafts_only_where_the_tokens_left_could_repay_its_reading(
        reads_first: int, max_tokens: int, drafts: bool) -> None:
    """Taking turns with the target, the model's first draft reads the prompt while the target waits: paid for
    certain, against a saving only as likely as its drafts' acceptance (the neutral prior, none measured yet)."""
    costs = RouteCosts(0.1, 4)
    # 20 tok/s plain; rounds of 4 drafts in 0.02 + 0.06 s: 1.94 tokens at α 0.5 (24 tok/s), 5 if all accepted
    costs.seed(Calibration(64, 0.05, ((4, 0.06),), 0.005, draft_read_seconds_per_token=0.01))
    policy = RequestPolicy(costs, FallbackConfig(k_min=4, k_max=4), 4, Choice(4, "start"),
                           reads_first=reads_first, max_tokens=max_tokens)
    decision = policy.decide()
    assert (model_k(decision) == 4) == drafts
    assert ("reading 500 tokens first would hold the target 5.00 s" in decision.reason) == (not drafts)


def test_a_probe_times_one_round_before_costs_rule_the_model_out() -> None:
    """Costs timed long ago (a busy start-up, say) must not rule the model out for good: a probe re-times them."""
    costs = RouteCosts(0.1, 4)
    costs.seed(Calibration(64, 0.05, ((4, 0.5),), 0.01))  # as timed: even all accepted, 5 tokens per 0.54 s
    probe = RequestPolicy(costs, FallbackConfig(k_min=4, k_max=4), 4, Choice(0, "route in passthrough"),
                          reads_along=True)
    assert model_k(probe.decide()) == 4 and probe.model_may_pay()
    probe.observe(round_event(1, 4, 4, draft_s=0.04, verify_s=0.5))  # the round ran as timed: still no use
    assert model_k(probe.decide()) == 0 and not probe.model_may_pay()
