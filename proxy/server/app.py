"""create_app(config): the proxy's routes, middleware and per-route resources (opened and closed in cleanup_ctx)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import structlog
from aiohttp import web

from proxy.config.schema import Config, DraftConfig, Route
from proxy.control.route import RouteController
from proxy.drafting.base import Drafter
from proxy.drafting.llama import LlamaDrafter
from proxy.drafting.lookup import HybridDrafter, LookupDrafter, SuffixDrafter
from proxy.drafting.suffix import LookupSettings
from proxy.engine.gate import CoreGate
from proxy.engine.llama import EngineOptions
from proxy.errors import UpstreamError
from proxy.models import fetch as models
from proxy.observability.metrics import Metrics
from proxy.server import admin, guard, handlers, heap, live, other_paths
from proxy.server.cores import MODEL_KINDS, shares_cores
from proxy.server.in_flight import in_flight_limit
from proxy.server.runtime import CONFIG, METRICS, RUNTIMES, RouteRuntime
from proxy.targets.base import Target
from proxy.targets.sglang import SGLangTarget
from proxy.targets.upstream import Timeouts, Upstream
from proxy.targets.vllm import VLLMTarget
from proxy.wire.errors import error_middleware

log = structlog.get_logger("speculoos.app")

DrafterLoader = Callable[[EngineOptions], Drafter]


def draft_options(draft: DraftConfig) -> EngineOptions:
    """Engine options for a route's draft (resolving a registry name to its file)."""
    return EngineOptions(models.resolve(draft.model), n_ctx=draft.ctx, n_threads=draft.threads,
                         n_batch=draft.batch, n_gpu_layers=draft.gpu_layers, n_seq=draft.parallel)


def make_upstream(route: Route, gate: CoreGate | None = None) -> Upstream:
    """The pooled client for a route's upstream (its calls taking turns at the gate, when given)."""
    t = route.timeouts
    return Upstream(route.upstream.url, Timeouts(t.connect, t.first_byte, t.idle, t.pool),
                    api_key=route.upstream.api_key_value(), connections=route.upstream.connections, gate=gate,
                    forward_client_key=route.upstream.forward_client_key)


def takes_turns(route: Route) -> bool:
    """Whether the route's draft model computes on the cores its target computes on (then they take turns)."""
    draft = route.draft
    return draft is not None and draft.kind in MODEL_KINDS and shares_cores(draft, route.upstream.url)


def make_target(route: Route, upstream: Upstream) -> Target | None:
    """The verification client for the route's protocol (None: the protocol cannot verify)."""
    if route.upstream.protocol == "sglang":
        return SGLangTarget(upstream)
    if route.upstream.protocol == "vllm":
        return VLLMTarget(upstream, route.upstream.model)
    return None


def with_lookup(model: Drafter, draft: DraftConfig) -> Drafter:
    """The route's draft kind around the loaded model: itself, prompt lookup, suffix lookup, or suffix then model."""
    if draft.kind == "model":
        return model
    if draft.kind == "ngram":
        return LookupDrafter(model, max_ngram=draft.ngram_max, min_ngram=draft.ngram_min)
    settings = LookupSettings(draft.k_max, draft.min_token_prob, draft.match_factor, draft.ngram_min,
                              draft.candidates)
    kind = SuffixDrafter if draft.kind == "suffix" else HybridDrafter
    history_tokens = 0 if draft.share_history == "none" else draft.history_tokens
    return kind(model, settings, history_tokens=history_tokens, per_tenant=draft.share_history == "key")


@dataclass
class Resources:
    """Every route's runtime, and the models they share (each closed once)."""

    runtimes: dict[str, RouteRuntime]
    models: list[Drafter]

    async def close(self) -> None:
        """Close upstream clients and free the models."""
        for runtime in self.runtimes.values():
            await runtime.upstream.close()
        for model in self.models:
            model.close()


async def open_resources(config: Config, load_drafter: DrafterLoader, *, cost_scale: float = 1.0) -> Resources:
    """Open every route's upstream client and drafter (drafts with identical settings share one model); speculation's
    timed costs are multiplied by cost_scale (a testing aid: proxy.control.cost_scale)."""
    resources = Resources({}, [])
    loaded: dict[EngineOptions, Drafter] = {}
    gate = CoreGate()  # one machine's cores: every draft model that shares them takes turns with its target
    for route in config.routes:
        shared = gate if takes_turns(route) else None
        if shared is not None:  # drafting ahead would only wait for the verification it meant to overlap
            route = route.model_copy(update={"speculation": route.speculation.model_copy(update={"pipeline": False})})
        upstream = make_upstream(route, shared)
        target = make_target(route, upstream)
        drafter = None
        if route.draft is not None and target is not None:
            options = draft_options(route.draft)
            if options not in loaded:
                loaded[options] = await asyncio.to_thread(load_drafter, options)
                resources.models.append(loaded[options])
            if shared is not None and isinstance(loaded[options], LlamaDrafter):
                loaded[options].take_turns(shared)
            drafter = with_lookup(loaded[options], route.draft)
            target.vocab_size = drafter.vocabulary.n_vocab  # the upstream's answers are checked against it
        controller = RouteController(route.fallback, route.speculation.k, looks_up=bool(drafter and drafter.looks_up),
                                     pipelined=route.speculation.pipeline, cost_scale=cost_scale)
        runtime = RouteRuntime(route, upstream, controller, target, drafter, takes_turns=shared is not None)
        resources.runtimes[route.name] = runtime
        await _inspect(runtime)
    return resources


async def _settled_heap(_: web.Application) -> AsyncIterator[None]:
    """The collector tuned while the app serves (start-up's objects frozen), as it was before once it closes."""
    with heap.settled():
        yield


async def _inspect(runtime: RouteRuntime) -> None:
    """Probe the upstream and check tokenizers at start-up; an unreachable upstream is checked later."""
    try:
        verdict = await runtime.inspect_upstream()
    except UpstreamError as exc:
        log.warning("tokenizer_check_deferred", route=runtime.name, reason=exc.message)
        return
    if verdict is not None:
        event = log.info if verdict.compatible else log.warning
        event("tokenizer_check", route=runtime.name, compatible=verdict.compatible, reason=verdict.reason)


def create_app(config: Config, *, load_drafter: DrafterLoader = LlamaDrafter.load,
               cost_scale: float = 1.0, settle_heap: bool = False) -> web.Application:
    """The proxy application for a validated config (cost_scale: see open_resources; settle_heap: the garbage
    collector tuned once the routes are open, for a process that serves this app alone)."""
    # The guard inside the error middleware: its refusals are rendered like every other error.
    held = in_flight_limit(config.server.max_in_flight, config.server.max_parsed_bytes,
                           config.server.max_body_parsed_bytes)
    app = web.Application(middlewares=[error_middleware, held, guard.browser_guard],
                          client_max_size=config.server.max_body_bytes)
    app.on_response_prepare.append(guard.add_cors_headers)
    app[CONFIG] = config
    app[METRICS] = Metrics()

    async def route_resources(app: web.Application) -> AsyncIterator[None]:
        resources = await open_resources(config, load_drafter, cost_scale=cost_scale)
        app[RUNTIMES] = resources.runtimes
        yield
        await resources.close()

    app.cleanup_ctx.append(route_resources)
    if settle_heap:
        app.cleanup_ctx.append(_settled_heap)
    app.router.add_post("/v1/chat/completions", handlers.chat_completions)
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_get("/v1/models", admin.list_models)
    app.router.add_get("/metrics", admin.metrics_endpoint)
    app.router.add_get("/speculoos/status", admin.status)
    live.setup(app)  # before the catch-all, which would forward its paths upstream
    app.router.add_route("*", "/{tail:.*}", other_paths.passthrough_any)
    return app
