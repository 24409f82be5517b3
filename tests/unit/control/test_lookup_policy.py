"""Lookup paths: how much of one is worth verifying, the plain chunk after a miss, and α kept apart by source."""

from __future__ import annotations

from dataclasses import replace

import pytest

from proxy.config.speculation import AssumedCostsConfig, FallbackConfig
from proxy.control.assumed_costs import AssumedCosts
from proxy.control.costs import RouteCosts
from proxy.control.lookup import MAX_PLAIN_CHUNK, MIN_PLAIN_CHUNK, lookup_length, plain_chunk_size
from proxy.control.policy import Choice, RequestPolicy
from proxy.decode.events import PlainEvent, RoundEvent
from tests.unit.control.rounds import played


def measured(verify: dict[int, float]) -> RouteCosts:
    costs = RouteCosts(0.1, 8)
    for k, seconds in verify.items():
        costs.record_round(played(k, k, 0.0, seconds, lookup=True))
    return costs


def model_priced(verify: dict[int, float], plain_seconds: float) -> RouteCosts:
    """Costs timed by model rounds and plain decoding: no lookup path measured yet."""
    costs = RouteCosts(0.1, 8)
    for k, seconds in verify.items():
        costs.record_round(played(k, k, 0.0, seconds))
    costs.record_plain(tokens=20, seconds=20 * plain_seconds)
    return costs


CPU = {1: 0.10, 4: 0.19, 16: 0.55}  # verification grows with K
GPU = {1: 0.030, 4: 0.031, 16: 0.033}  # flat


def test_nothing_measured_verifies_the_whole_path() -> None:
    assert lookup_length(RouteCosts(0.1, 8), [0.9] * 12, competing_rate=None) == 12


@pytest.mark.parametrize(("verify", "probs", "expected"), [
    (GPU, [1.0] * 16, 16),  # flat cost: every sure token is worth verifying
    (CPU, [1.0] * 16, 16),  # a sure copy pays even where verification is steep
    (GPU, [1.0] * 4 + [0.2] * 12, 16),  # on a GPU the weak tail costs nearly nothing
    (CPU, [1.0] * 4 + [0.2] * 12, 4),  # on a CPU it is cut where it stops paying
])
def test_the_worthwhile_prefix_depends_on_measured_costs(verify, probs, expected) -> None:
    assert lookup_length(measured(verify), probs, competing_rate=None) == expected


def test_a_path_slower_than_the_competition_is_not_verified() -> None:
    costs = measured(CPU)
    assert lookup_length(costs, [0.3], competing_rate=1 / 0.07) == 0  # 1.3 tokens in 0.1 s vs a 70 ms step
    assert lookup_length(costs, [1.0] * 16, competing_rate=1 / 0.07) == 16


def test_the_plain_rate_is_estimated_from_a_verification_of_nothing_until_measured() -> None:
    costs = measured({0: 0.08, 4: 0.2})
    assert costs.plain_rate_estimate() == pytest.approx(1 / 0.08)
    costs.record_plain(tokens=50, seconds=50 * 0.07)
    assert costs.plain_rate_estimate() == pytest.approx(1 / 0.07)


@pytest.mark.parametrize(("hits", "lookups", "expected"), [
    (0, 0, MIN_PLAIN_CHUNK), (10, 10, MIN_PLAIN_CHUNK), (0, 10, MAX_PLAIN_CHUNK), (5, 10, 7)])
def test_plain_chunks_grow_as_lookups_miss(hits: int, lookups: int, expected: int) -> None:
    assert plain_chunk_size(hits, lookups) == expected


def test_model_and_lookup_acceptance_are_kept_apart() -> None:
    costs = RouteCosts(0.5, 8)
    costs.record_round(played(4, 1, 0.1, 0.2))
    costs.record_round(played(16, 16, 0.0, 0.5, lookup=True))
    assert costs.alpha.value == 0.25 and costs.lookup_alpha.value == 1.0
    assert costs.draft_per_token.samples == 1 and set(costs.verify_by_k) == {4, 16}
    costs.record_round(played(12, 6, 0.1, 0.4, lookup=True, led=4))  # the model's 4 tokens, then 2 of the path's 8
    costs.record_round(played(12, 2, 0.1, 0.4, lookup=True, led=4))  # the model's own tokens rejected: the path untried
    assert costs.lookup_alpha.samples == 2 and costs.lookup_survival[0][2].samples == 2
    assert costs.alpha.samples == 1 and costs.verify_by_k[12].samples == 2


def lookup_round(drafted: int, accepted: int, match: int = 0, seconds: float = 0.1) -> RoundEvent:
    """A lookup round whose path was found after `match` matching context tokens."""
    return RoundEvent(request_id="r", route="route", index=1, k=drafted, drafted=tuple(range(drafted)),
                      accepted=accepted, emitted=(0,) * (accepted + 1), draft_seconds=0.0, verify_seconds=seconds,
                      source="lookup", match=match)


def trimmed(policy: RequestPolicy, probs: list[float], match: int = 0) -> int:
    """The worthwhile prefix of a lookup path (found after `match` context tokens), in a round the policy decided."""
    return policy.lookup_length(probs, match, policy.decide())


def test_a_request_learns_how_far_its_lookup_paths_hold() -> None:
    costs = measured(CPU)
    policy = RequestPolicy(costs, FallbackConfig(), 4, start=Choice(4, "configured"))
    sure = [1.0] * 16
    assert trimmed(policy, sure) == 16
    for _ in range(6):  # every path broke after its second token
        policy.observe(lookup_round(16, 2))
    assert trimmed(policy, sure) == 2  # verifying further costs more than it is expected to emit
    assert policy.lookup.survival(4, 0) == pytest.approx([1.0, 1.0, 2 / 8, 2 / 8], abs=0.1)
    assert (policy.lookup.lookups, policy.lookup.hits) == (6, 6)


@pytest.mark.parametrize("failed_match", [1, 12])
def test_paths_found_after_long_matches_are_judged_apart_from_short_ones(failed_match: int) -> None:
    costs = model_priced(CPU, plain_seconds=0.06)
    for match in (1, 12):  # earlier requests' paths, right in both classes
        costs.observe(lookup_round(4, 4, match=match, seconds=CPU[4]))
    policy = RequestPolicy(costs, FallbackConfig(), 4, start=Choice(0, "model off"))
    untried = policy.lookup.length([1.0] * 16, 1, costs.plain_rate)  # what a sure path gets before any failed
    assert untried > 0
    for _ in range(3):  # the reply's opening words: paths after a one-token match, all wrong (the control: long ones)
        failed = lookup_round(4, 0, match=failed_match, seconds=CPU[4])  # the costs stay as they were
        costs.observe(failed)
        policy.observe(failed)
    after_short, after_long = (policy.lookup.length([1.0] * 16, match, costs.plain_rate) for match in (1, 12))
    assert (after_short, after_long) == ((0, untried) if failed_match == 1 else (untried, 0))  # a copy is kept


def test_a_fresh_route_does_not_bet_a_cpu_verification_on_its_first_path() -> None:
    on_cpu = model_priced(CPU, plain_seconds=0.06)
    policy = RequestPolicy(on_cpu, FallbackConfig(), 4, start=Choice(0, "model off"))
    assert policy.lookup.survival(3, 0) == pytest.approx([0.5, 0.25, 0.125])  # the model draft's neutral α
    assert policy.lookup.length([1.0] * 16, 0, on_cpu.plain_rate) == 0  # 1.5 tokens in 0.1 s lose to a 60 ms step
    on_gpu = model_priced(GPU, plain_seconds=0.025)
    fresh = RequestPolicy(on_gpu, FallbackConfig(), 4, start=Choice(0, "model off"))
    assert fresh.lookup.length([1.0] * 16, 0, on_gpu.plain_rate) >= 4  # nearly flat cost: the likely head pays


def test_a_fresh_route_takes_a_clients_prediction_as_sure() -> None:
    costs = model_priced(CPU, plain_seconds=0.06)
    policy = RequestPolicy(costs, FallbackConfig(), 4, start=Choice(0, "model off"))
    assert trimmed(policy, [1.0] * 16) == 0  # a lookup path: declined until paths prove right
    assert policy.lookup_length([1.0] * 16, 0, policy.decide(), predicted=True) == 16  # the client's own statement


def test_the_route_learns_from_declined_paths_what_its_next_requests_verify() -> None:
    costs = model_priced(CPU, plain_seconds=0.06)
    path = tuple(range(16))
    for _ in range(4):  # declined paths of earlier requests, right as far as the target's chunks went
        costs.observe(PlainEvent("r", "route", path[:8], 0.48, lookup_missed=True, declined=path))
    costs.observe(PlainEvent("r", "route", (9, 9), 0.12, lookup_missed=True, declined=(1, 2)))  # one wrong
    assert [e.samples for e in costs.lookup_survival[0][:9]] == [5, 5, 4, 4, 4, 4, 4, 4, 0]
    policy = RequestPolicy(costs, FallbackConfig(), 4, start=Choice(0, "model off"))
    assert policy.lookup.length([1.0] * 16, 0, costs.plain_rate) > 0


def test_a_path_is_not_trusted_past_where_shorter_ones_broke() -> None:
    costs = model_priced({1: 0.127, 4: 0.263, 8: 0.588, 32: 1.45}, plain_seconds=0.076)
    policy = RequestPolicy(costs, FallbackConfig(), 4, start=Choice(0, "model off"))
    first = lookup_round(4, 1)  # the request's first path: its first token right, the next three wrong
    costs.observe(first)
    policy.observe(first)
    survival = policy.lookup.survival(18, 0)
    assert survival[0] == 1.0 and survival[1:].max() == 0.0  # positions no path reached yet do not rise again
    assert policy.lookup.length([1.0] * 18, 0, costs.plain_rate) <= 1  # not 18 tokens at ~1 s on a sure-looking path


def cut_round(drafted: int, accepted: int, *, beyond: int | None, then: int, seconds: float = 0.03) -> RoundEvent:
    """A lookup round on path 0, 1, 2, ... cut after `drafted` tokens; `then` is the target's own token."""
    return RoundEvent(request_id="r", route="route", index=1, k=drafted, drafted=tuple(range(drafted)),
                      accepted=accepted, emitted=(*range(accepted), then), draft_seconds=0.0,
                      verify_seconds=seconds, source="lookup", beyond=beyond)


def test_a_cut_path_accepted_whole_is_checked_one_token_further() -> None:
    assert cut_round(4, 4, beyond=4, then=4).path_checked == (5, 5)  # the path's next token was the target's
    assert cut_round(4, 4, beyond=4, then=9).path_checked == (5, 4)
    assert cut_round(4, 2, beyond=4, then=9).path_checked == (4, 2)  # rejected before the cut: nothing more known
    assert cut_round(4, 4, beyond=None, then=4).path_checked == (4, 4)  # not cut


@pytest.mark.parametrize("checked", [True, False])
def test_paths_grow_again_where_a_long_one_once_failed(checked: bool) -> None:
    costs = model_priced({**GPU, 32: 0.035}, plain_seconds=0.025)  # a longer path costs next to nothing more
    costs.observe(cut_round(32, 1, beyond=None, then=9))  # an earlier request's long path: right only at its start
    policy = RequestPolicy(costs, FallbackConfig(), 4, start=Choice(0, "model off"))
    lengths = []
    for _ in range(8):  # this request copies: each path right as far as it goes, and further
        length = policy.lookup.length([1.0] * 32, 0, costs.plain_rate)
        lengths.append(length)
        event = cut_round(length, length, beyond=length if checked else None, then=length)
        costs.observe(event)
        policy.observe(event)
    assert lengths == ([1, 2, 3, 4, 5, 6, 7, 8] if checked else [1] * 8)  # unchecked past the cut, it stays cut


def test_declined_paths_are_checked_against_what_the_target_produced() -> None:
    policy = RequestPolicy(measured(CPU), FallbackConfig(), 4, start=Choice(4, "configured"))
    for _ in range(6):
        policy.observe(lookup_round(16, 0))
    assert trimmed(policy, [1.0] * 16) == 0  # declined: slower than plain decoding at these odds
    path = tuple(range(16))
    for _ in range(8):  # the declined paths were right after all: the chunks the target decoded say so
        policy.observe(PlainEvent("r", "route", path[:8], 0.6, lookup_missed=True, declined=path))
    assert trimmed(policy, [1.0] * 16) > 0
    wrong = PlainEvent("r", "route", (9, 9, 9, 9), 0.3, lookup_missed=True, declined=(1, 2, 3))
    hits = policy.lookup.hits
    policy.observe(wrong)
    assert policy.lookup.hits == hits and policy.lookup.tried[0, 0] == 6 + 8 + 1


def test_under_assumed_gpu_costs_a_weak_tail_is_verified_too() -> None:
    costs = AssumedCosts(0.1, 8, AssumedCostsConfig(draft_ms=4, verify_ms_flat=25, plain_ms=25, rtt_ms=2))
    assert lookup_length(costs, [1.0] * 4 + [0.2] * 12, competing_rate=costs.plain_rate) == 16


def test_a_path_the_model_led_counts_from_where_the_path_starts() -> None:
    policy = RequestPolicy(measured(CPU), FallbackConfig(), 4, start=Choice(4, "configured"))
    led = RoundEvent(request_id="r", route="route", index=1, k=16, drafted=tuple(range(16)), accepted=6,
                     emitted=(0,) * 7, draft_seconds=0.0, verify_seconds=0.1, source="prediction", led=4)
    policy.observe(led)  # the model's 4 tokens accepted, then 2 of the path's 12
    assert (policy.lookup.lookups, policy.lookup.tried[0, :13].tolist()) == (1, [1.0] * 12 + [0.0])
    assert policy.lookup.right[0, :3].tolist() == [1.0, 1.0, 0.0]
    assert (policy.evidence.drafted, policy.evidence.accepted) == (4, 4)  # the model's part is the model's acceptance
    cut = replace(led, accepted=2, emitted=(0,) * 3)  # the edit itself was rejected: the path was never compared
    policy.observe(cut)
    assert policy.lookup.lookups == 1 and (policy.evidence.drafted, policy.evidence.accepted) == (8, 6)
