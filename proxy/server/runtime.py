"""What the proxy keeps per route while it runs: the upstream client, the drafter, the target and the controller."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from proxy.config.schema import Config, Route
from proxy.control.route import RouteController
from proxy.drafting.base import Drafter
from proxy.errors import UpstreamError
from proxy.observability.metrics import Metrics
from proxy.targets.base import Target
from proxy.targets.tokenizer_check import TokenizerVerdict, check_tokenizer
from proxy.targets.upstream import Upstream


@dataclass
class RouteRuntime:
    """One configured route with its live resources."""

    route: Route
    upstream: Upstream
    controller: RouteController
    target: Target | None = None  # None: the protocol cannot verify (openai)
    drafter: Drafter | None = None  # None: the route never speculates
    # Learned from the upstream, at start-up or, if it was unreachable then, on the first request:
    tokenizer: TokenizerVerdict | None = field(default=None, init=False)
    capabilities: object = field(default=None, init=False)

    @property
    def name(self) -> str:
        """The route's name from the config."""
        return self.route.name

    @property
    def speculates(self) -> bool:
        """Whether the route has what speculation needs: a drafter and a verifying target."""
        return self.drafter is not None and self.target is not None

    async def inspect_upstream(self) -> TokenizerVerdict | None:
        """Probe the target's capabilities and compare tokenizers (raises UpstreamError if unreachable)."""
        if self.target is None or self.drafter is None:
            return None
        self.capabilities = await self.target.probe()
        self.tokenizer = await check_tokenizer(self.drafter.vocabulary, self.upstream)
        return self.tokenizer

    async def tokenizer_problem(self) -> str | None:
        """The reason not to speculate on tokenizer grounds (checking now if start-up could not)."""
        if self.tokenizer is None:
            try:
                await self.inspect_upstream()
            except UpstreamError:
                return "tokenizer check pending: upstream unreachable"
        if self.tokenizer is not None and not self.tokenizer.compatible:
            return f"tokenizer mismatch: {self.tokenizer.reason}"
        return None


CONFIG = web.AppKey("config", Config)
RUNTIMES = web.AppKey("runtimes", dict)  # route name -> RouteRuntime
METRICS = web.AppKey("metrics", Metrics)
