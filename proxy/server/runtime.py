"""What the proxy keeps per route while it runs: the upstream client, the draft, and their verdicts."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from proxy.config.schema import Config, Route
from proxy.control.policy import RouteController
from proxy.drafting.llama import DraftModel
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
    draft: DraftModel | None = None
    tokenizer: TokenizerVerdict | None = None  # None until the check could reach the upstream
    capabilities: object = None  # what the target's probe found (version, logprob cap, extensions)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The route's name from the config."""
        return self.route.name

    async def inspect_upstream(self) -> TokenizerVerdict | None:
        """Probe the target's capabilities and compare tokenizers (raises UpstreamError if unreachable)."""
        if self.target is None or self.draft is None:
            return None
        self.capabilities = await self.target.probe()
        self.tokenizer = await check_tokenizer(self.draft.engine, self.upstream)
        return self.tokenizer


CONFIG = web.AppKey("config", Config)
RUNTIMES = web.AppKey("runtimes", dict)  # route name -> RouteRuntime
METRICS = web.AppKey("metrics", Metrics)
