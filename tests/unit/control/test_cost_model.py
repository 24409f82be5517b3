"""The one cost model: expected tokens, round time, verification by K from measurements or stated costs."""

from __future__ import annotations

import pytest

from proxy.config.speculation import AssumedCostsConfig
from proxy.control.cost_model import (
    MIN_VERIFY_SECONDS,
    CostModel,
    expected_tokens,
    round_seconds,
    sequential_rate,
    speculative_rate,
    verify_from_measured,
)


@pytest.mark.parametrize(("alpha", "k", "expected"), [
    (0.0, 4, 1.0),  # every draft rejected: only the target's token
    (1.0, 4, 5.0),  # all accepted plus the bonus
    (0.5, 1, 1.5),
    (0.5, 3, 1.875),  # (1 - 0.5^4) / 0.5
    (0.8, 4, (1 - 0.8**5) / 0.2),
    (0.5, 2.5, (1 - 0.5**3.5) / 0.5),  # a mean K
])
def test_expected_tokens_per_round(alpha: float, k: float, expected: float) -> None:
    assert expected_tokens(alpha, k) == pytest.approx(expected)


@pytest.mark.parametrize(("hit", "draft_s", "verify_s", "expected"), [
    (0.0, 0.05, 0.30, 4 * 0.05 + 0.30),  # never a hit: the drafting is never hidden
    (1.0, 0.05, 0.30, 0.30),  # always a hit, and 5 draft steps fit within the verification
    (1.0, 0.10, 0.30, 0.30 + (5 * 0.10 - 0.30)),  # always a hit, but the drafting outlasts it
    (0.4, 0.05, 0.30, 0.30 + 0.6 * 4 * 0.05),
])
def test_a_pipelined_round_hides_the_drafting_on_hits(hit: float, draft_s: float, verify_s: float,
                                                      expected: float) -> None:
    assert round_seconds(4, hit, draft_s, verify_s, pipelined=True) == pytest.approx(expected)
    assert round_seconds(4, hit, draft_s, verify_s, pipelined=False) == pytest.approx(4 * draft_s + verify_s)


@pytest.mark.parametrize(("curve", "hit", "pipelined", "expected"), [
    ([1.0, 1.0], 0.0, False, 3 / (2 * 0.01 + 0.1)),
    ([0.5, 0.25], 0.0, False, 1.75 / (2 * 0.01 + 0.1)),
    ([1.0, 1.0], 1.0, True, 3 / 0.1),  # every round drafted during the last one's verification
])
def test_speculative_rate_is_tokens_per_round_over_round_time(curve: list[float], hit: float, pipelined: bool,
                                                              expected: float) -> None:
    assert speculative_rate(curve, 2, 0.01, 0.1, hit=hit, pipelined=pipelined) == pytest.approx(expected)


def test_the_sequential_rate_is_the_rate_of_the_alpha_survival_curve() -> None:
    assert sequential_rate(0.5, 2, 0.01, 0.1) == pytest.approx(speculative_rate([0.5, 0.25], 2, 0.01, 0.1))


CPU_MEASURED = {1: 0.10, 4: 0.23, 7: 0.43, 12: 0.62, 25: 1.00}  # as measured on a CPU


@pytest.mark.parametrize(("measured", "k", "expected"), [
    ({2: 0.3}, 2, 0.3),  # measured
    ({}, 1, None),  # nothing measured
    ({2: 0.3}, 5, 0.3 * 6 / 3),  # one point: cost grows with the tokens evaluated (K + 1)
    ({2: 0.3}, 0, 0.3 * 1 / 3),
    ({1: 0.1, 3: 0.3}, 2.5, 0.25),  # between two: a mean K
    (CPU_MEASURED, 8, 0.43 + (0.62 - 0.43) / 5),  # between the neighbours, not on the line through all (0.41)
    ({1: 0.1, 2: 0.2, 3: 0.3, 8: 5.0}, 2.5, 0.25),  # a slow outlier far away does not count
    ({2: 0.3, 4: 0.5}, 6, 0.7),  # beyond them: the line through all
    ({4: 0.5, 2: 0.3}, 0, 0.1),  # in any order
    ({2: 0.5, 4: 0.3}, 30, MIN_VERIFY_SECONDS),  # a falling line never reaches 0
])
def test_verification_time_from_measured_k(measured: dict, k: float, expected: float | None) -> None:
    found = verify_from_measured(measured, k)
    assert found == (None if expected is None else pytest.approx(expected))


def test_the_floor_is_in_the_unit_of_the_measurements() -> None:
    assert verify_from_measured({2: 500.0, 4: 300.0}, 30, floor=1e-3) == 1e-3


GPU = AssumedCostsConfig(draft_ms=4, verify_ms_flat=25, plain_ms=25, rtt_ms=2)
CPU = AssumedCostsConfig(draft_ms=60, verify_ms_per_token=60, plain_ms=60)


@pytest.mark.parametrize(("config", "k", "verify_ms", "round_ms", "verify_seconds"), [
    (GPU, 1, 25.0, 4 + 25 + 2, 0.027),  # flat: any K costs one pass, plus the round trip
    (GPU, 8, 25.0, 32 + 25 + 2, 0.027),
    (CPU, 4, 300.0, 240 + 300, 0.3),  # K + 1 tokens evaluated
])
def test_assumed_costs_are_a_cost_model(config: AssumedCostsConfig, k: int, verify_ms: float, round_ms: float,
                                        verify_seconds: float) -> None:
    model = CostModel.assumed(config)
    assert (model.draft_ms, model.plain_ms) == (config.draft_ms, config.plain_ms)
    assert model.verify_ms(k) == pytest.approx(verify_ms) and model.round_ms(k) == pytest.approx(round_ms)
    assert model.verify_seconds(k) == pytest.approx(verify_seconds)


@pytest.mark.parametrize("k", [0, 1, 3, 5, 10, 25, 32])
def test_a_measured_curve_is_read_as_the_controller_reads_its_measurements(k: int) -> None:
    model = CostModel("measured", 3.0, 0.0, 0.0, 0.0, 20.0, tuple((kk, s * 1000) for kk, s in CPU_MEASURED.items()))
    assert model.verify_ms(k) == pytest.approx(verify_from_measured(CPU_MEASURED, k) * 1000)
