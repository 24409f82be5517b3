"""The proxy's own endpoints: /v1/models, /metrics and /speculoos/status."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from aiohttp import web

from proxy.errors import UpstreamError
from proxy.sampling.processors import SamplingParams
from proxy.server.runtime import CONFIG, METRICS, RUNTIMES, RouteRuntime


def _has_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: each route's model names; glob routes list what their upstream serves."""
    seen: dict[str, dict[str, Any]] = {}
    for route in request.app[CONFIG].routes:
        pattern = route.match.model
        if not _has_glob(pattern):
            seen.setdefault(pattern, {"id": pattern, "object": "model", "created": 0, "owned_by": route.name})
            continue
        try:
            answer = await request.app[RUNTIMES][route.name].upstream.get_json("/v1/models")
        except UpstreamError:
            continue  # an unreachable upstream lists nothing rather than failing the whole list
        for entry in answer.get("data", []) if isinstance(answer, dict) else []:
            if isinstance(entry, dict) and isinstance(entry.get("id"), str) and fnmatchcase(entry["id"], pattern):
                seen.setdefault(entry["id"], {**entry, "owned_by": entry.get("owned_by", route.name)})
    return web.json_response({"object": "list", "data": list(seen.values())})


async def metrics_endpoint(request: web.Request) -> web.Response:
    """GET /metrics in Prometheus' text format."""
    body, content_type = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": content_type})


def _exact_for_any_sampling(runtime: RouteRuntime) -> bool:
    """Whether the target verifies exactly whatever the sampling parameters (unrestricted sampling is the test)."""
    target = runtime.target
    top_n = runtime.route.speculation.top_logprobs
    return target is not None and target.exactness_problem(SamplingParams(), top_n) is None


def _sequences(runtime: RouteRuntime) -> dict[str, int] | None:
    """How many of the draft's sequences requests hold now."""
    occupancy = runtime.drafter.occupancy() if runtime.drafter is not None else None
    return None if occupancy is None else {"in_use": occupancy[0], "total": occupancy[1]}


async def status(request: web.Request) -> web.Response:
    """GET /speculoos/status: every route's mode, α, K, costs and why."""
    routes = []
    for runtime in request.app[RUNTIMES].values():
        tokenizer = runtime.tokenizer
        routes.append({
            "route": runtime.name,
            "upstream": runtime.route.upstream.shown_url,
            "protocol": runtime.route.upstream.protocol,
            "draft": runtime.route.draft.model if runtime.route.draft else None,
            "exact_sampling": _exact_for_any_sampling(runtime),
            "draft_sequences": _sequences(runtime),
            "tokenizer": (None if tokenizer is None
                          else {"compatible": tokenizer.compatible, "reason": tokenizer.reason}),
            **runtime.controller.status(),
        })
    return web.json_response({"routes": routes})
