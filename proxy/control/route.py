"""A route's own decision: whether new requests speculate, from the route's measurements, with probes.

The route decides with its own α (an EWMA over every request's rounds), so one request's α never
flips the mode of the others, and turns the model off when its recent rounds, timed as they ran,
were slower than plain decoding (what the rule's parts do not show, the rounds' wall time does).
Once in passthrough, it probes speculation again every N requests or T seconds, so a route
recovers when the workload changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from proxy.config.schema import FallbackConfig
from proxy.control.assumed_costs import AssumedCosts
from proxy.control.costs import Calibration, RouteCosts
from proxy.control.policy import (
    MIN_ROUNDS_BEFORE_SWITCH,
    NO_DRAFT_K,
    NOT_MEASURED,
    Choice,
    PinnedPolicy,
    RequestPolicy,
    choose_k,
    measured_loss,
)
from proxy.decode.events import Event, PlainEvent, ReadEvent, RoundEvent

# The route judges its model by fewer timed rounds than a request does: wrongly off, it loses what probes
# win back; wrongly on, it slows every request that follows.
SPECULATIVE, PASSTHROUGH = "speculative", "passthrough"  # the two modes a request is served in
ROUTE_ROUNDS_TO_JUDGE = 4
ALPHA_NOT_MEASURED = "acceptance not measured yet: requests measure it (reading along, then rounds)"


@dataclass
class RouteController:
    """Online measurements and the speculate-or-pass decision for one route."""

    settings: FallbackConfig
    configured_k: int
    looks_up: bool = False  # the route's drafter proposes lookup paths: each request decides round by round
    pipelined: bool = False  # the route's requests draft ahead while a round is verified
    cost_scale: float = 1.0  # speculation's timed costs multiplied by it (proxy.control.cost_scale)
    clock: Callable[[], float] = time.monotonic
    costs: RouteCosts = field(init=False)
    current: Choice = field(init=False)
    requests_since_probe: int = 0
    last_probe: float = field(init=False)
    calibration: Calibration | None = None  # the costs timed at start-up, if they were

    def __post_init__(self) -> None:
        assumed = self.settings.assume_costs
        self.costs = (RouteCosts(self.settings.ewma_weight, self.settings.k_max, self.pipelined, self.cost_scale)
                      if assumed is None else AssumedCosts(self.settings.ewma_weight, self.settings.k_max, assumed))
        self.current = Choice(self.configured_k, NOT_MEASURED)
        self.last_probe = self.clock()

    def observe(self, event: Event) -> None:
        """A speculative generation's event: measure it, then decide again for the route."""
        self.costs.observe(event)
        if isinstance(event, RoundEvent | PlainEvent | ReadEvent):
            self.decide()

    def record_plain(self, tokens: int, seconds: float) -> None:
        """A passthrough answer's decoding rate (a measurement only; the route's mode changes at probes)."""
        self.costs.record_plain(tokens, seconds)

    def calibrated(self, calibration: Calibration) -> Choice:
        """Seed the costs with start-up timings and decide from them."""
        self.calibration = calibration
        self.costs.seed(calibration)
        return self.decide()

    def decide(self) -> Choice:
        """The route's decision from its own α and costs, unless its model rounds, timed as they ran, lost.

        Until some request measured α, costs alone turn the model off only where accepting every draft
        would not beat plain decoding by the margin that starting to speculate needs: a prior α would
        decide for the workload before any of it was seen.
        """
        alpha = self.costs.alpha
        if alpha.samples == 0:
            best = choose_k(self.costs, self.settings, self.configured_k, alpha=None, alpha_rounds=0,
                            speculating=False, curve=[1.0] * self.settings.k_max)
            self.current = (replace(best, reason=f"even accepting every draft, {best.reason}")
                            if best.k == NO_DRAFT_K else Choice(self.configured_k, ALPHA_NOT_MEASURED))
        else:
            self.current = choose_k(self.costs, self.settings, self.configured_k, alpha=alpha.value,
                                    alpha_rounds=alpha.samples, speculating=self.current.k > 0,
                                    curve=self.costs.survival(self.settings.k_max))
        rounds, rate = self.costs.model_rounds_run()
        if self.current.k == 0 or not rounds or self.costs.assumed:
            return self.current
        # One timed round suffices where even its every draft accepted lost; acceptance needs several.
        if (lost := measured_loss(self.costs.model_rounds_ceiling(), self.costs.plain_rate, self.settings)) is not None:
            self.current = replace(lost, reason=f"even accepting every draft, {lost.reason}")
        elif rounds >= ROUTE_ROUNDS_TO_JUDGE:
            self.current = measured_loss(rate, self.costs.plain_rate, self.settings) or self.current
        return self.current

    def policy(self, *, forced: bool = False, pipelined: bool | None = None, reads_along: bool = False,
               reads_first: int = 0, max_tokens: int | None = None) -> RequestPolicy | PinnedPolicy:
        """A new request's policy, starting from the route's decision; a forced one drafts at the configured K.

        On a route that looks up, every request speculates, so the model draft, once the route has
        turned it off, is explored again only at the probes' pace, not by every request.
        """
        if forced:
            return PinnedPolicy(self.configured_k, f"k={self.configured_k}: speculation forced by the client")
        explore = True
        if self.looks_up and self.current.k == NO_DRAFT_K:
            explore = self._count_towards_probe()  # the request counts; the probe explores
        return RequestPolicy(self.costs, self.settings, self.configured_k, self.current, explore=explore,
                             pipelined=pipelined, reads_along=reads_along, reads_first=reads_first,
                             max_tokens=max_tokens)

    def start_request(self) -> tuple[bool, str]:
        """Whether a new request should speculate, and why."""
        if self.looks_up:
            # A lookup round or a plain chunk costs about what passthrough does, and the request
            # itself chooses between them (and the model draft, if any) every round.
            return True, f"lookup drafts decide per round (model draft: {self.current.reason})"
        if self.current.k > 0:
            if self.costs.plain_rate is None and self.costs.alpha.samples >= MIN_ROUNDS_BEFORE_SWITCH:
                return False, "measuring the passthrough rate"
            return True, self.current.reason
        if self._count_towards_probe():
            return True, "probing speculation again"
        if self.costs.plain_rate is None:
            return False, "measuring the passthrough rate"
        return False, self.current.reason

    def _count_towards_probe(self) -> bool:
        """Count a request towards the next probe: whether it is the probe (every N requests or T seconds; the count
        then restarts). A request counts once: at admission, or when it gets its policy on a route that looks up."""
        self.requests_since_probe += 1
        if (self.requests_since_probe < self.settings.probe_every_requests
                and self.clock() - self.last_probe < self.settings.probe_every_seconds):
            return False
        self.requests_since_probe = 0
        self.last_probe = self.clock()
        return True

    def status(self) -> dict:
        """A JSON-friendly snapshot for /speculoos/status."""
        s, costs = self.settings, self.costs
        return {
            "mode": SPECULATIVE if self.current.k > 0 or self.looks_up else PASSTHROUGH,
            "k": self.current.k,
            "reason": self.current.reason,
            "alpha": costs.alpha.value,
            "lookup_alpha": costs.lookup_alpha.value,
            "lookup_survival": [[e.value for e in by_class if e.value is not None]
                                for by_class in costs.lookup_survival],  # by match class: 1, 2-3, 4-7, 8+ tokens
            "alpha_per_position": [e.value for e in costs.alpha_per_position],
            "draft_ahead_guess_right": costs.guess_right.value,
            "draft_seconds_per_token": costs.draft_per_token.value,
            "verify_seconds_by_k": {k: e.value for k, e in sorted(costs.verify_by_k.items())},
            "plain_tokens_per_second": costs.plain_rate,
            "reading_slowdown": costs.reading_slowdown(),
            "predicted_tokens_per_second_by_k": {k: costs.speculative_rate(k) for k in range(s.k_min, s.k_max + 1)},
            "assumed_costs": s.assume_costs.model_dump() if s.assume_costs else None,
            "calibration": asdict(self.calibration) if self.calibration else None,
        }
