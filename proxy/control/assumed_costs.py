"""A route's costs as configured instead of measured, for a bench that records on this machine the rounds a route
would make on other hardware; acceptance is still measured."""

from __future__ import annotations

from proxy.config.section import MAX_K
from proxy.config.speculation import AssumedCostsConfig
from proxy.control.cost_model import CostModel
from proxy.control.costs import Calibration, Ewma, RouteCosts
from proxy.decode.events import RoundEvent


class AssumedCosts(RouteCosts):
    """A route's costs as configured instead of measured; acceptance is still measured.

    The route then decides K, lookup lengths and plain chunks as it would on the hardware those
    costs describe, so a bench on this machine records the rounds that hardware would make.
    """

    assumed = True

    def __init__(self, weight: float, k_max: int, config: AssumedCostsConfig) -> None:
        super().__init__(weight, k_max, pipelined=False)  # the replayed cost model is sequential
        self.config = config
        self.model = CostModel.assumed(config)
        self.draft_per_token = Ewma(1.0, self.model.draft_ms / 1000.0, 1)
        self.plain_per_token = Ewma(1.0, self.model.plain_ms / 1000.0, 1)

    def _record_costs(self, event: RoundEvent) -> None:
        """Nothing: the costs are assumed."""

    def record_plain(self, tokens: int, seconds: float, *, draft_busy: bool = False) -> None:
        """Nothing: the plain rate is assumed."""

    def seed(self, calibration: Calibration) -> None:
        """Nothing: the costs are assumed."""

    def verified_sizes(self) -> int:
        """Every K is known."""
        return MAX_K + 1

    def verify_time(self, k: int, context: int | None = None) -> float:
        """A round trip and a verification of k drafts and the bonus position, as assumed."""
        return self.model.verify_seconds(k)
