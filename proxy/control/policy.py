"""Per-route speculation control: measure costs online, pick the K that maximises tokens/s, or 0.

K = 0 means passthrough. The rule, per round (Leviathan et al. 2023, §3.1):
    expected tokens per round  E(α, K) = (1 − α^(K+1)) / (1 − α)      (K + 1 when α = 1)
    round time                 T(K)    = K · draft_time_per_token + verify_time(K)
    speculative rate           E / T   versus   the plain (passthrough) rate 1 / plain_time_per_token
Costs are measured, never assumed: verification time as a function of K is flat on a GPU and
steep on a CPU, and the plain rate comes from real passthrough requests. The controller explores
what it has not measured, adds hysteresis so it does not flap, and, once in passthrough, probes
speculation again every N requests or T seconds so a route recovers when the workload changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from proxy.config.schema import FallbackConfig

PASSTHROUGH_K = 0
UNMEASURED_ALPHA = 0.5  # a neutral prior before any round was seen
MIN_PLAIN_TOKENS = 4  # shorter passthrough answers say little about the decoding rate
MIN_ROUNDS_BEFORE_SWITCH = 4  # a request (a probe especially) measures a few rounds before it may switch


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens emitted by a round of k drafts at acceptance rate α (Leviathan et al., eq. 1)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class Ewma:
    """An exponentially weighted moving average."""

    weight: float
    value: float | None = None
    samples: int = 0

    def add(self, x: float) -> None:
        """Fold in one observation."""
        self.value = x if self.value is None else (1.0 - self.weight) * self.value + self.weight * x
        self.samples += 1


@dataclass(frozen=True)
class Decision:
    """What the controller chose and why."""

    k: int  # 0 = passthrough
    reason: str
    predicted_rate: float | None = None  # tokens/s expected for the chosen mode
    plain_rate: float | None = None


@dataclass
class RouteController:
    """Online measurements and the K decision for one route."""

    settings: FallbackConfig
    configured_k: int
    clock: Callable[[], float] = time.monotonic
    alpha: Ewma = field(init=False)
    alpha_per_position: list[Ewma] = field(init=False)
    draft_per_token: Ewma = field(init=False)
    verify_by_k: dict[int, Ewma] = field(init=False)
    plain_per_token: Ewma = field(init=False)
    current: Decision = field(init=False)
    requests_since_probe: int = 0
    last_probe: float = field(init=False)

    def __post_init__(self) -> None:
        weight = self.settings.ewma_alpha
        self.alpha = Ewma(weight)
        self.alpha_per_position = [Ewma(weight) for _ in range(self.settings.k_max)]
        self.draft_per_token = Ewma(weight)
        self.verify_by_k = {}
        self.plain_per_token = Ewma(weight)
        self.current = Decision(self.configured_k, "not measured yet: speculating with the configured k")
        self.last_probe = self.clock()

    # -- measurements -------------------------------------------------------------------------

    def record_round(self, k: int, accepted: int, draft_seconds: float, verify_seconds: float,
                     *, costs: bool = True) -> None:
        """One speculative round's outcome, and its costs unless they include a prefill (costs=False)."""
        if k > 0:
            self.alpha.add(accepted / k)
            for position in range(min(k, len(self.alpha_per_position))):
                self.alpha_per_position[position].add(1.0 if position < accepted else 0.0)
        if not costs:
            return
        if k > 0:
            self.draft_per_token.add(draft_seconds / k)
        self.verify_by_k.setdefault(k, Ewma(self.settings.ewma_alpha)).add(verify_seconds)

    def record_plain(self, tokens: int, seconds: float) -> None:
        """Target-only decoding: a passthrough answer or a plain chunk after a mid-stream switch."""
        if tokens >= MIN_PLAIN_TOKENS and seconds > 0:
            self.plain_per_token.add(seconds / tokens)

    # -- cost model -----------------------------------------------------------------------------

    def verify_time(self, k: int) -> float | None:
        """Predicted verification time for k drafts: measured, or a line fitted through what was measured."""
        measured = {kk: e.value for kk, e in self.verify_by_k.items() if e.value is not None}
        if k in measured:
            return measured[k]
        if not measured:
            return None
        if len(measured) == 1:
            # One point cannot tell a flat GPU from a steep CPU: assume cost grows with the tokens
            # evaluated (k + 1), the cautious guess; exploring a neighbour refines it.
            (known_k, known_t), = measured.items()
            return known_t * (k + 1) / (known_k + 1)
        ks = np.array(list(measured), dtype=float)
        slope, intercept = np.polyfit(ks, np.array(list(measured.values())), 1)
        return max(float(intercept + slope * k), 1e-6)

    def speculative_rate(self, k: int, alpha: float | None = None) -> float | None:
        """Predicted tokens/s with k drafts per round (at the route's α unless one is given)."""
        verify = self.verify_time(k)
        if verify is None or self.draft_per_token.value is None:
            return None
        if alpha is None:
            alpha = self.alpha.value if self.alpha.value is not None else UNMEASURED_ALPHA
        return expected_tokens(alpha, k) / (k * self.draft_per_token.value + verify)

    @property
    def plain_rate(self) -> float | None:
        """Measured target-only tokens/s."""
        value = self.plain_per_token.value
        return 1.0 / value if value else None

    # -- decisions ------------------------------------------------------------------------------

    def decide(self, request_alpha: float | None = None) -> Decision:
        """The K for the next round (0 = switch to plain decoding).

        `request_alpha`, the running request's own acceptance rate, is the best estimate for its
        workload (code editing and open chat differ wildly on one route); the route's α serves
        when the request has none yet.
        """
        s = self.settings
        alpha = request_alpha if request_alpha is not None else self.alpha.value
        rates = {k: self.speculative_rate(k, alpha) for k in range(s.k_min, s.k_max + 1)}
        known = {k: r for k, r in rates.items() if r is not None}
        if not known:
            return self._set(Decision(self.configured_k, "not measured yet: speculating with the configured k"))
        best_k = max(known, key=lambda k: known[k])
        plain = self.plain_rate
        if alpha is not None and self.alpha.samples >= MIN_ROUNDS_BEFORE_SWITCH and alpha < s.min_acceptance:
            return self._set(Decision(PASSTHROUGH_K, f"α {alpha:.2f} below min_acceptance "
                                      f"{s.min_acceptance}", plain, plain))
        if plain is None:
            return self._set(Decision(best_k, "passthrough rate not measured yet", known[best_k]))
        margin = (1.0 - s.hysteresis) if self.current.k > 0 else (1.0 + s.hysteresis)
        if known[best_k] < plain * margin:
            return self._set(Decision(PASSTHROUGH_K, f"speculation predicted {known[best_k]:.1f} tok/s at k={best_k}"
                                      f" vs {plain:.1f} tok/s plain", plain, plain))
        return self._set(Decision(best_k, f"k={best_k} predicted {known[best_k]:.1f} tok/s vs {plain:.1f} plain",
                                  known[best_k], plain))

    def _set(self, decision: Decision) -> Decision:
        self.current = decision
        return decision

    def start_request(self) -> tuple[bool, str]:
        """Whether a new request should speculate, and why."""
        if self.current.k > 0:
            if self.plain_rate is None and self.alpha.samples >= MIN_ROUNDS_BEFORE_SWITCH:
                return False, "measuring the passthrough rate"
            return True, self.current.reason
        self.requests_since_probe += 1
        due = (self.requests_since_probe >= self.settings.probe_every_requests
               or self.clock() - self.last_probe >= self.settings.probe_every_seconds)
        if due:
            self.requests_since_probe = 0
            self.last_probe = self.clock()
            return True, "probing speculation again"
        if self.plain_rate is None:
            return False, "measuring the passthrough rate"
        return False, self.current.reason

    def status(self) -> dict:
        """A JSON-friendly snapshot for /speculoos/status."""
        s = self.settings
        return {
            "mode": "speculative" if self.current.k > 0 else "passthrough",
            "k": self.current.k,
            "reason": self.current.reason,
            "alpha": self.alpha.value,
            "alpha_per_position": [e.value for e in self.alpha_per_position],
            "draft_seconds_per_token": self.draft_per_token.value,
            "verify_seconds_by_k": {k: e.value for k, e in sorted(self.verify_by_k.items())},
            "plain_tokens_per_second": self.plain_rate,
            "predicted_tokens_per_second_by_k": {k: self.speculative_rate(k) for k in range(s.k_min, s.k_max + 1)},
        }
