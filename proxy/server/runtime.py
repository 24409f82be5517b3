"""What the proxy keeps per route while it runs: the upstream client, the drafter, the target and the controller."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from aiohttp import web

from proxy.config.schema import Config, Route
from proxy.control.costs import Calibration
from proxy.control.route import RouteController
from proxy.drafting.base import Drafter
from proxy.errors import NotFoundError, SpeculoosError, UpstreamError
from proxy.observability.metrics import Metrics
from proxy.server.calibrate import calibrate
from proxy.targets.base import Target
from proxy.targets.tokenizer_check import TokenizerVerdict, check_tokenizer
from proxy.targets.upstream import Upstream

log = structlog.get_logger("speculoos.route")

PENDING = "tokenizer check pending: upstream unreachable"
FIRST_BACKOFF_S, MAX_BACKOFF_S = 1.0, 60.0  # after a failed check, none before this long (doubling per failure)


@dataclass
class RouteRuntime:
    """One configured route with its live resources."""

    route: Route
    upstream: Upstream
    controller: RouteController
    target: Target | None = None  # None: the protocol cannot verify (openai)
    drafter: Drafter | None = None  # None: the route never speculates
    takes_turns: bool = False  # its draft model and its target share this machine's cores, in turns
    # Learned from the upstream, at start-up or, if it was unreachable then, on the first request:
    tokenizer: TokenizerVerdict | None = field(default=None, init=False)
    capabilities: object = field(default=None, init=False)
    clock: Callable[[], float] = time.monotonic
    # Requests arriving while the upstream is down share one check, and after a failure wait out a backoff.
    _checking: asyncio.Future | None = field(default=None, init=False, repr=False)
    _failures: int = field(default=0, init=False)
    _retry_at: float = field(default=0.0, init=False)

    @property
    def name(self) -> str:
        """The route's name from the config."""
        return self.route.name

    @property
    def speculates(self) -> bool:
        """Whether the route has what speculation needs: a drafter and a verifying target."""
        return self.drafter is not None and self.target is not None

    async def inspect_upstream(self, *, calibrate: bool = True) -> TokenizerVerdict | None:
        """Probe the target's capabilities and compare tokenizers (raises UpstreamError if unreachable); then, at
        start-up, time the route's costs when its config asks to and the tokenizers match."""
        if self.target is None or self.drafter is None:
            return None
        self.capabilities = await self.target.probe()
        self.tokenizer = await check_tokenizer(self.drafter.vocabulary, self.upstream, self.target.ends_seen)
        if calibrate and self.tokenizer.compatible and self.route.fallback.calibrate:
            await self.calibrate()
        return self.tokenizer

    async def calibrate(self) -> None:
        """Time a few plain steps, verifications and draft steps, and seed the controller's costs with them."""
        assert self.target is not None and self.drafter is not None
        if self.controller.costs.assumed:
            return  # the route decides with configured costs
        started = time.perf_counter()
        try:
            calibration = await calibrate(self.route, self.target, self.drafter)
        except SpeculoosError as exc:  # the first requests measure the costs instead, as without calibration
            log.warning("calibration_skipped", route=self.name, reason=str(exc))
            return
        decision = self.controller.calibrated(calibration)
        log.info("calibrated", route=self.name, seconds=round(time.perf_counter() - started, 2),
                 **calibration_fields(calibration), model_draft=decision.reason)

    async def tokenizer_problem(self) -> str | None:
        """The reason not to speculate on tokenizer grounds (checking now if start-up could not)."""
        if self.tokenizer is None:
            check = self._check()
            if check is None:
                return PENDING  # a check failed a moment ago: not again before the backoff ends
            try:
                await asyncio.shield(check)  # a client that leaves does not stop the others' check
            except UpstreamError:
                return PENDING
        if self.tokenizer is not None and not self.tokenizer.compatible:
            return f"tokenizer mismatch: {self.tokenizer.reason}"
        return None

    def _check(self) -> asyncio.Future | None:
        """The check in flight, or a new one; None while a failed one's backoff runs."""
        if self._checking is None:
            if self.clock() < self._retry_at:
                return None
            self._checking = asyncio.ensure_future(self.inspect_upstream(calibrate=False))  # timing costs would delay
            self._checking.add_done_callback(self._checked)
        return self._checking

    def _checked(self, check: asyncio.Future) -> None:
        """Count a finished check: a failure doubles the wait before the next."""
        self._checking = None
        if check.cancelled() or check.exception() is not None:
            self._failures += 1
            self._retry_at = self.clock() + min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (self._failures - 1))
        else:
            self._failures = 0


def calibration_fields(calibration: Calibration) -> dict[str, object]:
    """A calibration in milliseconds, for a log line or `speculoos check`."""
    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1000, 1)

    return {"plain_ms_per_token": ms(calibration.plain_seconds_per_token),
            "verify_ms_by_k": {k: ms(seconds) for k, seconds in calibration.verify_seconds},
            "draft_ms_per_token": ms(calibration.draft_seconds_per_token),
            "draft_read_ms_per_token": ms(calibration.draft_read_seconds_per_token), "context": calibration.context}


CONFIG = web.AppKey("config", Config)
RUNTIMES = web.AppKey("runtimes", dict)  # route name -> RouteRuntime
METRICS = web.AppKey("metrics", Metrics)


def route_of(request: web.Request, model: str | None) -> RouteRuntime | None:
    """The runtime of the first route that takes a request for `model` on this path, if any."""
    route = request.app[CONFIG].match(model, request.path)
    return request.app[RUNTIMES][route.name] if route is not None else None


def no_route(request: web.Request, model: str | None) -> NotFoundError:
    """The 404 of a request no route takes."""
    return NotFoundError(f"no route serves model {model!r} on {request.path}", param="model")


def runtime_for(request: web.Request, model: str | None) -> RouteRuntime:
    """The runtime of the first route that takes this request, or a 404."""
    if (runtime := route_of(request, model)) is None:
        raise no_route(request, model)
    return runtime
