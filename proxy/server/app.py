"""create_app(config): the proxy's routes, middleware and per-route resources (opened and closed in cleanup_ctx)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import structlog
from aiohttp import web

from proxy.models import fetch as models
from proxy.server import handlers as api
from proxy.config.schema import Config, DraftConfig, Route
from proxy.control.policy import RouteController
from proxy.drafting.llama import DraftModel
from proxy.engine.llama import EngineOptions
from proxy.errors import UpstreamError
from proxy.observability.metrics import Metrics
from proxy.drafting.lookup import HybridDraft, NgramDraft
from proxy.server.runtime import CONFIG, METRICS, RUNTIMES, RouteRuntime
from proxy.targets.sglang import SGLangTarget
from proxy.targets.vllm import VLLMTarget
from proxy.targets.upstream import Timeouts, Upstream
from proxy.server.middleware import error_middleware

log = structlog.get_logger("speculoos.app")

DraftLoader = Callable[[EngineOptions], DraftModel]


def draft_options(draft: DraftConfig) -> EngineOptions:
    """Engine options for a route's draft (resolving a registry name to its file)."""
    return EngineOptions(models.resolve(draft.model), n_ctx=draft.ctx, n_threads=draft.threads,
                         n_batch=draft.batch, n_gpu_layers=draft.gpu_layers)


def make_upstream(route: Route) -> Upstream:
    """The pooled client for a route's upstream."""
    t = route.timeouts
    return Upstream(route.upstream.url, Timeouts(t.connect, t.first_byte, t.idle),
                    api_key=route.upstream.api_key_value())


def with_lookup(model: DraftModel, draft: DraftConfig) -> DraftModel:
    """The route's draft kind around the loaded model: itself, prompt lookup, or both."""
    if draft.kind == "model":
        return model
    kind = NgramDraft if draft.kind == "ngram" else HybridDraft
    return kind(model, max_ngram=draft.ngram_max, min_ngram=draft.ngram_min)  # type: ignore[return-value]


async def open_runtimes(config: Config, load_draft: DraftLoader) -> dict[str, RouteRuntime]:
    """Open every route's upstream client and draft (drafts with identical settings are shared)."""
    runtimes: dict[str, RouteRuntime] = {}
    drafts: dict[EngineOptions, DraftModel] = {}
    for route in config.routes:
        controller = RouteController(route.fallback, route.speculation.k)
        runtime = RouteRuntime(route, make_upstream(route), controller)
        runtimes[route.name] = runtime
        if route.upstream.protocol == "sglang":
            runtime.target = SGLangTarget(runtime.upstream)
        elif route.upstream.protocol == "vllm":
            runtime.target = VLLMTarget(runtime.upstream, route.upstream.model)
        if route.draft is None or runtime.target is None:
            continue
        options = draft_options(route.draft)
        if options not in drafts:
            drafts[options] = await asyncio.to_thread(load_draft, options)
        runtime.draft = with_lookup(drafts[options], route.draft)
        try:
            verdict = await runtime.inspect_upstream()
        except UpstreamError as exc:
            log.warning("tokenizer_check_deferred", route=route.name, reason=exc.message)
            continue
        if verdict is not None:
            event = log.info if verdict.compatible else log.warning
            event("tokenizer_check", route=route.name, compatible=verdict.compatible, reason=verdict.reason,
                  exact_sampling=runtime.target.exact_support)
    return runtimes


async def close_runtimes(runtimes: dict[str, RouteRuntime]) -> None:
    """Close upstream clients and free drafts (each shared draft once)."""
    for runtime in runtimes.values():
        await runtime.upstream.close()
    for draft in {id(r.draft.engine): r.draft for r in runtimes.values() if r.draft is not None}.values():
        draft.close()


def create_app(config: Config, *, load_draft: DraftLoader = DraftModel.load) -> web.Application:
    """The proxy application for a validated config."""
    app = web.Application(middlewares=[error_middleware], client_max_size=config.server.max_body_bytes)
    app[CONFIG] = config
    app[METRICS] = Metrics()

    async def route_resources(app: web.Application) -> AsyncIterator[None]:
        app[RUNTIMES] = await open_runtimes(config, load_draft)
        yield
        await close_runtimes(app[RUNTIMES])

    app.cleanup_ctx.append(route_resources)
    app.router.add_post("/v1/chat/completions", api.chat_completions)
    app.router.add_post("/v1/completions", api.completions)
    app.router.add_get("/v1/models", api.list_models)
    app.router.add_get("/metrics", api.metrics_endpoint)
    app.router.add_get("/speculoos/status", api.status)
    app.router.add_route("*", "/{tail:.*}", api.passthrough_any)
    return app
