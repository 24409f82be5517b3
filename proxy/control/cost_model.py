"""What a speculative round costs and yields: the one cost model of the controller, the bench and SIMULATION.

    expected tokens  E(α, K) = (1 − α^(K+1)) / (1 − α), K + 1 at α = 1      (Leviathan et al. 2023, eq. 1)
    verification     from measured K: the measured time; between measured K, the line between the
                     neighbours; beyond them, the least-squares line through all (one point: its time
                     scaled by the K + 1 tokens evaluated); never below MIN_VERIFY_SECONDS.
                     Or stated (CostModel): verify_ms_flat + verify_ms_per_token · (K + 1) + rtt_ms.
    round            sequential: K · draft time per token + verification; pipelined: the next round is
                     drafted during the verification, which hides the drafting on a hit
    rate             (1 + Σ survival) / round time; with survival α^j, E(α, K) / round time

The controller feeds it measurements (proxy/control/costs.py), the bench the costs a proxy reports
(proxy/bench/prediction.py), and SIMULATION and fallback.assume_costs a CostModel of stated milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from proxy.config.speculation import AssumedCostsConfig
from proxy.drafting.base import Source

MIN_VERIFY_SECONDS = 1e-6  # a line through measured times may reach 0 or below; a verification never costs nothing
MIN_SLOPE_SAMPLES = 16
MIN_CONTEXT_SPREAD = 32  # tokens (standard deviation within a K): less cannot tell a slope from noise


def expected_tokens(alpha: float, k: float) -> float:
    """Expected tokens emitted by a round of k drafts at acceptance rate α (Leviathan et al., eq. 1)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def round_seconds(k: float, hit: float, draft_per_token: float, verify: float, *, pipelined: bool) -> float:
    """Expected time of a round of k drafts, from the end of the previous round.

    Sequential: draft k tokens, then the round trip and verification. Pipelined: the next round is
    drafted (a guessed target token, then k drafts) while this one is verified; on a hit (the
    previous round accepted everything and the guess was right, probability `hit`) the draft costs
    only what outlasts the verification.
    """
    if not pipelined:
        return k * draft_per_token + verify
    return verify + (1.0 - hit) * k * draft_per_token + hit * max(0.0, (k + 1) * draft_per_token - verify)


def speculative_rate(curve: Sequence[float], k: int, draft_per_token: float, verify: float, *,
                     hit: float = 0.0, pipelined: bool = False) -> float:
    """Tokens/s of rounds of k drafts whose first j + 1 drafts all survive with probability curve[j]."""
    return (1.0 + sum(curve)) / round_seconds(k, hit, draft_per_token, verify, pipelined=pipelined)


def sequential_rate(alpha: float, k: float, draft_per_token: float, verify: float) -> float:
    """Tokens/s of sequential rounds of k drafts (k may be a mean) accepted independently at rate α."""
    return expected_tokens(alpha, k) / round_seconds(k, 0.0, draft_per_token, verify, pipelined=False)


def verify_from_measured(measured: Mapping[int, float], k: float, *, floor: float = MIN_VERIFY_SECONDS) -> float | None:
    """Verification time for k drafts from the times measured by K (None: nothing measured), in their unit."""
    return MeasuredVerify(measured, floor=floor)(k)


class MeasuredVerify:
    """Verification times by K from the times measured by K; the line beyond them is fitted once for every K asked.

    The line through all measured K is used only beyond them: a CPU's cost is not one line (long
    drafts cost less per token than short ones), and one slow outlier K must not skew its neighbours.
    """

    def __init__(self, measured: Mapping[int, float], *, floor: float = MIN_VERIFY_SECONDS) -> None:
        self.measured = dict(measured)
        self.floor = floor
        self._line: np.ndarray | None = None  # [slope, intercept] through every measured K, once fitted
        self._answers: dict[float, float | None] = {}

    def __call__(self, k: float) -> float | None:
        """Verification time for k drafts (None: nothing measured)."""
        if k not in self._answers:
            self._answers[k] = self._answer(k)
        return self._answers[k]

    def _answer(self, k: float) -> float | None:
        """What __call__ returns, computed."""
        measured = self.measured
        if k in measured:
            return measured[k]  # type: ignore[index]
        if not measured:
            return None
        below, above = [kk for kk in measured if kk < k], [kk for kk in measured if kk > k]
        if below and above:
            low, high = max(below), min(above)
            return float(np.interp(k, [low, high], [measured[low], measured[high]]))
        if len(measured) == 1:
            # One point cannot tell a flat GPU from a steep CPU: assume cost grows with the tokens
            # evaluated (k + 1), the cautious guess; exploring a neighbour refines it.
            (known_k, known_t), = measured.items()
            return known_t * (k + 1) / (known_k + 1)
        if self._line is None:
            ks = np.array(list(measured), dtype=float)
            self._line = np.polyfit(ks, np.array(list(measured.values())), 1)
        slope, intercept = self._line
        return max(float(intercept + slope * k), self.floor)


def at_context(verify: float, slope: float, context: int, typical: float) -> float:
    """A verification time measured at a typical context, moved to `context` along the fitted slope."""
    return max(verify + slope * (context - typical), MIN_VERIFY_SECONDS)


def fit_context_slope(recent: Sequence[tuple[int, int, float]]) -> float:
    """Seconds a verification gains per token of context, from (k, context, seconds) rows (0 until contexts varied
    enough to tell).

    Each row is taken against the mean of those with the same K, so the slope is not confused with
    the cost of K. A server that evaluates the whole context again every round (vLLM without a
    prefix-cache hit) shows it; one that caches it shows about 0.
    """
    rows = np.array(recent, dtype=float).reshape(-1, 3)
    spread = seconds = 0.0
    for k in np.unique(rows[:, 0]):
        group = rows[rows[:, 0] == k]
        contexts = group[:, 1] - group[:, 1].mean()
        spread += float(contexts @ contexts)
        seconds += float(contexts @ (group[:, 2] - group[:, 2].mean()))
    if len(rows) < MIN_SLOPE_SAMPLES or spread < len(rows) * MIN_CONTEXT_SPREAD**2:
        return 0.0
    return max(seconds / spread, 0.0)


@dataclass(frozen=True)
class CostModel:
    """Stated costs in milliseconds: what SIMULATION replays and what a route with fallback.assume_costs decides by."""

    name: str
    draft_ms: float  # per drafted token
    verify_ms_flat: float  # per verification pass, whatever its size (a GPU's memory-bound pass)
    verify_ms_per_token: float  # per token a pass evaluates (a CPU's compute-bound pass)
    rtt_ms: float  # per round trip to the target
    plain_ms: float  # per token of plain decoding on the target
    verify_curve: tuple[tuple[int, float], ...] = ()  # measured (K, ms), K ascending; empty: the two terms above
    proxy_ms: float = 0.0  # the proxy's own CPU per round (speculoos bench overhead), charged by SIMULATION

    @classmethod
    def assumed(cls, config: AssumedCostsConfig) -> CostModel:
        """A route's fallback.assume_costs."""
        return cls("assumed", config.draft_ms, config.verify_ms_flat, config.verify_ms_per_token, config.rtt_ms,
                   config.plain_ms)

    def verify_ms(self, drafted: float) -> float:
        """One verification pass over `drafted` drafts and the bonus position, the round trip left out."""
        if self.verify_curve:
            return verify_from_measured(dict(self.verify_curve), drafted,  # type: ignore[return-value]
                                        floor=MIN_VERIFY_SECONDS * 1000.0)
        return self.verify_ms_flat + self.verify_ms_per_token * (drafted + 1)

    def round_ms(self, drafted: float, *, source: str = Source.MODEL, steps: float | None = None) -> float:
        """One sequential speculative round: a model draft costs a step a token; a path, the model's `steps` (its
        check, the tokens it led with), else by its source: the prediction's check one step, a lookup nothing."""
        draft_steps = (drafted if source == Source.MODEL else steps if steps is not None
                       else 1.0 if source == Source.PREDICTION else 0.0)
        return draft_steps * self.draft_ms + self.verify_ms(drafted) + self.rtt_ms + self.proxy_ms

    def verify_seconds(self, k: int) -> float:
        """A round trip and a verification of k drafts, in seconds: what a route measures as a round's verification."""
        return (self.verify_ms(k) + self.rtt_ms) / 1000.0
