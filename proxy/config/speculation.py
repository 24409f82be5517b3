"""The speculation and fallback sections: K and acceptance, when to stop and probe, and assumed costs."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, ValidationInfo, field_validator, model_validator

from proxy.config.section import MAX_K, Section


class SpeculationConfig(Section):
    """How many tokens to draft per round and how strictly to accept them."""

    enabled: bool = True
    k: int = Field(default=4, ge=1, le=MAX_K)
    sampling: Literal["exact", "bounded"] = "exact"
    max_tv: float = Field(default=0.0, ge=0, le=1)
    top_logprobs: int = Field(default=20, ge=1, le=100)
    # Draft-ahead: while a round is being verified, draft the next one as if every draft is accepted.
    pipeline: bool = True
    # Whether a client may force rounds (X-Speculoos: on or k=N, the `speculoos` field); a refused one passes
    # through. Unset: only where a round costs the server O(K) tokens or the upstream is this machine.
    allow_force: bool | None = None

    @field_validator("max_tv")
    @classmethod
    def _zero_unless_bounded(cls, max_tv: float, info: ValidationInfo) -> float:
        """A total-variation budget contradicts exact sampling."""
        if max_tv > 0 and info.data.get("sampling") == "exact":
            raise ValueError("must be 0 with sampling: exact (use sampling: bounded to allow drift)")
        return max_tv


class AssumedCostsConfig(Section):
    """Costs in milliseconds that a route decides with instead of measuring them (to record a SIMULATION's trace).

    They are the terms of proxy/control/cost_model.py's CostModel, the one SIMULATION replays.
    """

    draft_ms: float = Field(ge=0)  # per drafted token
    verify_ms_flat: float = Field(default=0.0, ge=0)  # per verification, whatever its K
    verify_ms_per_token: float = Field(default=0.0, ge=0)  # per token a verification evaluates (K + 1)
    rtt_ms: float = Field(default=0.0, ge=0)  # per round trip to the target
    plain_ms: float = Field(gt=0)  # per token of plain decoding

    @model_validator(mode="after")
    def _verification_costs_time(self) -> AssumedCostsConfig:
        """A verification that costs nothing would make every K look free."""
        if self.verify_ms_flat + self.verify_ms_per_token <= 0:
            raise ValueError("verify_ms_flat or verify_ms_per_token must be > 0")
        return self


class FallbackConfig(Section):
    """When to stop speculating, when to probe again, and the range K may move in."""

    min_acceptance: float = Field(default=0.3, ge=0, le=1)
    k_min: int = Field(default=1, ge=1)
    k_max: int = Field(default=8, ge=1, le=MAX_K)
    hysteresis: float = Field(default=0.05, ge=0, le=1)
    probe_every_requests: int = Field(default=20, ge=1)
    probe_every_seconds: float = Field(default=300.0, gt=0)
    # The weight of a new observation in the route's moving averages (`ewma_alpha`, its former name, still reads).
    ewma_weight: float = Field(default=0.1, gt=0, le=1, validation_alias=AliasChoices("ewma_weight", "ewma_alpha"))
    # Time a few plain steps, verifications and draft steps at start-up, so the first request is decided
    # from measured costs instead of paying to learn them.
    calibrate: bool = True
    # Decide as if these were the costs (acceptance is still measured): a bench records, on this
    # machine, the rounds a route would make on other hardware, for `speculoos bench --simulate`.
    assume_costs: AssumedCostsConfig | None = None

    @field_validator("k_max")
    @classmethod
    def _not_below_k_min(cls, k_max: int, info: ValidationInfo) -> int:
        """The range must not be empty."""
        k_min = info.data.get("k_min")
        if k_min is not None and k_max < k_min:
            raise ValueError(f"must be >= fallback.k_min ({k_min}) (got {k_max})")
        return k_max
