"""The route's costs reuse what did not change (the context slope, verification times by K): the decisions and the
predictions they give are those of costs that compute everything again every time they are asked."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.config.schema import FallbackConfig
from proxy.control.cost_model import at_context, fit_context_slope, verify_from_measured
from proxy.control.costs import Calibration, RouteCosts
from proxy.control.route import RouteController
from proxy.decode.events import Event, PlainEvent, ReadEvent, RoundEvent
from proxy.drafting.base import Source


class FromScratch(RouteCosts):
    """Costs that refit the context slope and every verification time whenever one is asked for."""

    def verify_time(self, k: int, context: int | None = None) -> float | None:
        base = verify_from_measured({kk: e.value for kk, e in self.verify_by_k.items() if e.value is not None}, k)
        if base is None or context is None:
            return base
        seen = self.context_by_k.get(k)
        typical = seen.value if seen and seen.value is not None else np.mean(
            [e.value for e in self.context_by_k.values() if e.value is not None])
        return at_context(base, fit_context_slope(self.recent), context, float(typical))


def events(seed: int, n: int) -> list[Event]:
    """A route's traffic: lookup paths first, then model rounds whose acceptance falls and recovers, with plain
    chunks and chunks the draft read; verification grows with K and with a context that keeps growing."""
    rng = np.random.default_rng(seed)
    out: list[Event] = []
    for i in range(n):
        context = 300 + 7 * i + int(rng.integers(0, 400))
        lookup = i < n // 5 or rng.random() < 0.3
        k = int(rng.integers(1, 13)) if lookup else int(rng.choice([2, 3, 5]))
        alpha = 0.9 if i < n // 2 or i > 3 * n // 4 else 0.15
        accepted = int(np.argmin(rng.random(k + 1) < np.r_[np.full(k, alpha), 0.0]))
        verify = 0.02 + 0.004 * k + 2e-6 * context + float(rng.normal(0, 1e-3))
        out.append(RoundEvent(request_id="r", route="route", index=i, k=k, drafted=tuple(range(k)), accepted=accepted,
                              emitted=tuple(range(accepted + 1)), draft_seconds=0.0 if lookup else 0.006 * k,
                              verify_seconds=verify, source=Source.LOOKUP if lookup else Source.MODEL,
                              candidates=1 + int(rng.random() < 0.1), prefill=rng.random() < 0.1, context=context))
        if rng.random() < 0.15:
            out.append(PlainEvent("r", "route", tuple(range(8)), 8 * (0.02 + float(rng.normal(0, 2e-3))),
                                  draft_busy=rng.random() < 0.3))
        if rng.random() < 0.05:
            out.append(ReadEvent("r", "route", (1, 2, 3, 4, 5, 6), (1, 2, 3, 9, 5, 6)))
    return out


@pytest.mark.parametrize(("k_max", "pipelined", "seed"), [(8, False, 1), (32, True, 2), (16, False, 3)])
def test_decisions_and_predictions_match_costs_computed_from_scratch(k_max: int, pipelined: bool, seed: int) -> None:
    settings = FallbackConfig(k_max=k_max)
    reused = RouteController(settings, configured_k=4, pipelined=pipelined)
    scratch = RouteController(settings, configured_k=4, pipelined=pipelined)
    scratch.costs = FromScratch(settings.ewma_weight, settings.k_max, pipelined)
    calibration = Calibration(400, 0.03, ((1, 0.03), (4, 0.04)), 0.006)
    assert reused.calibrated(calibration) == scratch.calibrated(calibration)
    decisions = set()
    for index, event in enumerate(events(seed, 240)):
        reused.observe(event)
        scratch.observe(event)
        assert reused.current == scratch.current
        decisions.add(reused.current.k)
        if index % 20:  # what a request's policy asks for, now and then: refitting from scratch is slow
            continue
        assert reused.costs.context_slope == fit_context_slope(scratch.costs.recent)
        for k in range(1, k_max + 3):
            for context in (None, 50, 9_000):
                assert reused.costs.verify_time(k, context) == scratch.costs.verify_time(k, context)
                assert (reused.costs.speculative_rate(k, context=context)
                        == scratch.costs.speculative_rate(k, context=context))
    assert reused.costs.context_slope > 0  # the traffic moved times along context
    assert len(decisions) >= 2 and 0 in decisions  # and turned the model off and on again
