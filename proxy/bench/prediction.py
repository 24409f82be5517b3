"""What the cost model predicts for a bench row, from the costs the proxy reports (GET /speculoos/status).

    predicted   Leviathan et al. 2023 (§3.1) from the row's measured α and the route's costs:
                    rate(α, k) = E(α, k) / (k · draft_seconds_per_token + verify_seconds(k))
                divided by the plain rate, 1 / median ITL of `direct` on the same workload. Tokens
                the proxy served by plain decoding (passthrough, a mid-stream switch) are predicted
                at the plain rate.
When the proxy reports each request's rounds (round_trace), the prediction replays them: each
round at the verification time of its own K (lookup paths vary from 1 to 32), model drafts at
the measured draft time, plain chunks at the plain rate. verify_seconds(k) is the controller's own
prediction from the measured K (proxy/control/cost_model.py), so bench and controller agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.control.cost_model import sequential_rate, verify_from_measured


@dataclass(frozen=True)
class Costs:
    """A route's measured costs, from GET /speculoos/status."""

    draft_seconds_per_token: float | None
    verify_seconds_by_k: Mapping[int, float]
    plain_tokens_per_second: float | None

    @classmethod
    def from_status(cls, route: Mapping[str, Any]) -> Costs:
        """Read one route's entry (JSON turns the K keys into strings)."""
        by_k = {int(k): float(v) for k, v in (route.get("verify_seconds_by_k") or {}).items() if v is not None}
        return cls(route.get("draft_seconds_per_token"), by_k, route.get("plain_tokens_per_second"))

    def verify_seconds(self, k: float) -> float | None:
        """Verification time at k (None: nothing measured), as the controller predicts it from the same K."""
        return verify_from_measured(self.verify_seconds_by_k, k)


def predicted_speedup(alpha: float, k: float, costs: Costs, plain_rate: float,
                      speculative_share: float = 1.0) -> float | None:
    """Predicted rate ÷ plain rate; a share of tokens served plainly runs at the plain rate."""
    verify = costs.verify_seconds(k)
    if verify is None or costs.draft_seconds_per_token is None or plain_rate <= 0:
        return None
    rate = sequential_rate(alpha, k, costs.draft_seconds_per_token, verify)
    seconds_per_token = speculative_share / rate + (1.0 - speculative_share) / plain_rate
    return (1.0 / seconds_per_token) / plain_rate


def traced_rate(extensions: Sequence[Mapping[str, Any]], costs: Costs, plain_rate: float) -> float | None:
    """Tokens/s predicted for speculative requests from their own rounds: each round's K at its measured
    verification time, the model's drafted tokens at its measured draft time, plain chunks at the plain rate.

    Rounds whose K varies (lookup paths of any length) are predicted round by round, not at a mean K.
    """
    tokens = seconds = 0.0
    for extension in extensions:
        trace = extension.get("round_trace")
        if not trace:
            return None
        for drafted, accepted, *_ in trace:
            verify = costs.verify_seconds(drafted)
            if verify is None:
                return None
            tokens, seconds = tokens + accepted + 1, seconds + verify
        model_drafted = int(((extension.get("drafts") or {}).get("model") or {}).get("drafted") or 0)
        if model_drafted:
            if costs.draft_seconds_per_token is None:
                return None
            seconds += model_drafted * costs.draft_seconds_per_token
        plain = int(extension.get("plain_tokens") or 0)
        tokens, seconds = tokens + plain, seconds + plain / plain_rate
    return tokens / seconds if seconds > 0 else None
