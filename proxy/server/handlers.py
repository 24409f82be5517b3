"""The proxy's HTTP handlers: OpenAI generation (speculative or passthrough), models, metrics, status.

Each generation request is routed, then served in one of two modes:
- speculative: prompt ids from the upstream's /tokenize, rounds of draft + verify, emitted here
  (and continued by plain decoding on the target if speculation stops paying mid-stream);
- passthrough: the original request forwarded untouched.
One structured log event per request says which, and why.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import numpy as np
import structlog
from aiohttp import web

from proxy.control.policy import MIN_ROUNDS_BEFORE_SWITCH
from proxy.errors import BadRequestError, NotFoundError, UpstreamError
from proxy.wire.openai import CHAT, COMPLETION, GenerationRequest, parse_generation_request, write_generation
from proxy.server.passthrough import TokenMeter, forward
from proxy.decode.loop import RoundHooks, RoundPlan, RoundStats, speculative_tokens
from proxy.server.runtime import CONFIG, METRICS, RUNTIMES, RouteRuntime
from proxy.targets.topn import bound_problem, exactness_problem
from proxy.wire.textstream import TextStream

log = structlog.get_logger("speculoos.request")

SPECULATIVE = "speculative"
PASSTHROUGH = "passthrough"
MODE_HEADER = "X-Speculoos-Mode"
CONTROL_HEADER = "X-Speculoos"  # "off", "on" (skip the controller), or "k=N" (pin K)
CONTROL_FIELD = "speculoos"  # body: {"mode": "off" | "on" | "auto", "k": N}; removed before forwarding
MAX_PINNED_K = 32


@dataclass(frozen=True)
class RequestControl:
    """What the client asked of speculation for this one request."""

    off: bool = False
    forced: bool = False  # speculate even where the controller would pass through
    pinned_k: int | None = None


def _pinned(value: Any, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PINNED_K:
        raise BadRequestError(f"{source}: k must be an integer in 1..{MAX_PINNED_K}", param=CONTROL_FIELD)
    return value


def request_control(headers: Any, body: dict) -> RequestControl:
    """Read the X-Speculoos header and the `speculoos` body field."""
    header = headers.get(CONTROL_HEADER, "").strip().lower()
    field = body.get(CONTROL_FIELD, {})
    if not isinstance(field, dict) or set(field) - {"mode", "k"} or field.get("mode", "auto") not in ("on", "off", "auto"):
        raise BadRequestError("'speculoos' must be an object with 'mode' (on, off, auto) and/or 'k'", param=CONTROL_FIELD)
    if header.startswith("k="):
        value = header[2:]
        return RequestControl(forced=True, pinned_k=_pinned(int(value) if value.isdigit() else value, CONTROL_HEADER))
    if header not in ("", "on", "off", "auto"):
        raise BadRequestError(f"{CONTROL_HEADER} must be off, on, auto or k=N", param=CONTROL_HEADER)
    off = header == "off" or field.get("mode") == "off"
    pinned = _pinned(field["k"], CONTROL_FIELD) if "k" in field else None
    return RequestControl(off=off, forced=header == "on" or field.get("mode") == "on" or pinned is not None,
                          pinned_k=pinned)


def _runtime_for(request: web.Request, model: str | None) -> RouteRuntime:
    route = request.app[CONFIG].match(model, request.path)
    if route is None:
        raise NotFoundError(f"no route serves model {model!r} on {request.path}", param="model")
    return request.app[RUNTIMES][route.name]


async def _tokenizer_problem(runtime: RouteRuntime) -> str | None:
    """Run the tokenizer check if start-up could not reach the upstream; the reason not to speculate."""
    if runtime.tokenizer is None:
        try:
            await runtime.inspect_upstream()
        except UpstreamError:
            return "tokenizer check pending: upstream unreachable"
        if runtime.tokenizer is not None and not runtime.tokenizer.compatible:
            log.warning("tokenizer_mismatch", route=runtime.name, reason=runtime.tokenizer.reason)
    if runtime.tokenizer is not None and not runtime.tokenizer.compatible:
        return f"tokenizer mismatch: {runtime.tokenizer.reason}"
    return None


async def _passthrough_reason(runtime: RouteRuntime, parsed: GenerationRequest, control: RequestControl) -> str | None:
    """Why this request is not served speculatively, or None if it is."""
    if runtime.draft is None or runtime.target is None:
        return "route has no draft model" if runtime.draft is None else "upstream protocol cannot verify"
    if not runtime.route.speculation.enabled:
        return "speculation disabled for this route"
    if control.off:
        return "client opted out"
    if parsed.unsupported:
        return "parameters only the upstream can honour: " + ", ".join(parsed.unsupported)
    if not runtime.target.exact_support:
        spec = runtime.route.speculation
        problem = exactness_problem(parsed.sampling_params, spec.top_logprobs, runtime.target.order)
        if problem is not None and spec.sampling == "exact":
            return f"cannot be exact: {problem}"
        if problem is not None and (bounded := bound_problem(parsed.sampling_params)) is not None:
            return f"cannot be bounded: {bounded}"
    if (mismatch := await _tokenizer_problem(runtime)) is not None:
        return mismatch
    if control.forced:
        return None
    speculate, reason = runtime.controller.start_request()
    return None if speculate else f"controller: {reason}"


def _upstream_body(raw: bytes, body: dict, runtime: RouteRuntime) -> bytes:
    """The body to forward: unchanged unless the route renames the model or the client sent our field."""
    if runtime.route.upstream.model is None and CONTROL_FIELD not in body:
        return raw
    forwarded = {k: v for k, v in body.items() if k != CONTROL_FIELD}
    if runtime.route.upstream.model is not None:
        forwarded["model"] = runtime.route.upstream.model
    return json.dumps(forwarded).encode()


async def _generation(request: web.Request, kind: str) -> web.StreamResponse:
    started = time.perf_counter()
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequestError(f"the request body is not valid JSON: {exc}") from exc
    parsed = parse_generation_request(body, kind)  # type: ignore[arg-type]
    control = request_control(request.headers, body)
    runtime = _runtime_for(request, parsed.model)
    metrics = request.app[METRICS]
    structlog.contextvars.bind_contextvars(request_id=uuid.uuid4().hex[:12], route=runtime.name)
    summary: dict[str, Any] = {"kind": kind, "stream": parsed.stream}
    try:
        reason = await _passthrough_reason(runtime, parsed, control)
        forwarded = _upstream_body(raw, body, runtime)
        if reason is None:
            summary["mode"] = SPECULATIVE
            response = await _speculate(request, runtime, parsed, control, forwarded, summary, started)
        else:
            summary.update(mode=PASSTHROUGH, reason=reason)
            response = await _pass(request, runtime, forwarded, started, summary)
        summary["status"] = response.status
        metrics.requests.labels(runtime.name, summary["mode"]).inc()
        return response
    except asyncio.CancelledError:
        summary.update(status=499, error="client disconnected")  # nginx's code for it
        raise
    except Exception as exc:
        summary.update(status=getattr(exc, "status", 500), error=type(exc).__name__)
        raise
    finally:
        log.info("request", ms=round((time.perf_counter() - started) * 1000, 1), **summary)
        structlog.contextvars.clear_contextvars()


async def _pass(request: web.Request, runtime: RouteRuntime, body: bytes, started: float,
                summary: dict[str, Any]) -> web.StreamResponse:
    """Passthrough, measuring the target's plain decoding rate on the way."""
    meter = TokenMeter()
    response = await forward(request, runtime.upstream, body=body, extra_headers={MODE_HEADER: PASSTHROUGH},
                             meter=meter)
    tokens = meter.completion_tokens()
    if response.status == 200 and tokens and meter.first_byte is not None and meter.last_byte is not None:
        # Streams: time between first and last byte (prefill excluded); JSON: the whole request.
        since = meter.first_byte if meter.first_byte < meter.last_byte else started
        runtime.controller.record_plain(tokens, meter.last_byte - since)
        request.app[METRICS].ttft.labels(runtime.name, PASSTHROUGH).observe(meter.first_byte - started)
        summary["completion_tokens"] = tokens
    return response


def _hooks(request: web.Request, runtime: RouteRuntime, control: RequestControl, stats: RoundStats) -> RoundHooks:
    """Connect the round loop to the route's controller and the metrics."""
    controller, metrics, name = runtime.controller, request.app[METRICS], runtime.name

    def next_k(rounds_done: int) -> int:
        if control.pinned_k is not None:
            return control.pinned_k
        if rounds_done < MIN_ROUNDS_BEFORE_SWITCH:
            return controller.current.k or -1  # a probe (current k = 0) uses the configured k
        previous = controller.current
        decision = controller.decide(request_alpha=stats.acceptance_rate)
        metrics.set_decision(name, decision.k, controller.alpha.value)
        if (decision.k > 0) != (previous.k > 0) or decision.k != previous.k:
            log.info("decision", k=decision.k, reason=decision.reason)
        if decision.k == 0 and not control.forced:
            metrics.mid_stream_switches.labels(name).inc()
            return 0
        return max(decision.k, 1)

    def on_round(k: int, accepted: int, draft_s: float, verify_s: float, warm: bool) -> None:
        controller.record_round(k, accepted, draft_s, verify_s, costs=warm)
        metrics.record_round(name, k, accepted, draft_s, verify_s)

    return RoundHooks(next_k=next_k, on_round=on_round, on_plain=controller.record_plain)


async def _timed(tokens: AsyncIterator[Sequence[int]], started: float, request: web.Request,
                 route: str) -> AsyncIterator[Sequence[int]]:
    """Observe time to first token and inter-token latency as batches go by."""
    metrics, last = request.app[METRICS], None
    try:
        async for batch in tokens:
            now = time.perf_counter()
            if last is None:
                metrics.ttft.labels(route, SPECULATIVE).observe(now - started)
            elif batch:
                metrics.itl.labels(route).observe((now - last) / len(batch))
            last = now
            yield batch
    finally:
        await tokens.aclose()  # type: ignore[attr-defined]


async def _speculate(request: web.Request, runtime: RouteRuntime, parsed: GenerationRequest,
                     control: RequestControl, forwarded: bytes, summary: dict[str, Any],
                     started: float) -> web.StreamResponse:
    assert runtime.draft is not None and runtime.target is not None  # checked by _passthrough_reason
    draft, spec = runtime.draft, runtime.route.speculation
    authorization = request.headers.get("Authorization")  # case-insensitive lookup
    client_headers = {"Authorization": authorization} if authorization else None
    prompt_ids, context_size = await runtime.target.prompt_ids(parsed.body, parsed.kind, client_headers)
    max_tokens = parsed.max_tokens_within(len(prompt_ids), context_size, "the upstream's")
    if not draft.fits(len(prompt_ids) + max_tokens + spec.k):
        summary.update(mode=PASSTHROUGH, reason="prompt + max_tokens exceed the draft's context")
        return await _pass(request, runtime, forwarded, started, summary)
    plan = RoundPlan(control.pinned_k or spec.k, parsed.sampling_params, runtime.target.order,
                     spec.top_logprobs, client_headers, max_tv=spec.max_tv)
    stats = RoundStats()
    stream = TextStream(draft.engine.token_bytes, draft.engine.is_end_of_generation,
                        stop=parsed.stop, max_tokens=max_tokens)
    tokens = speculative_tokens(draft, runtime.target, prompt_ids, max_tokens, plan,
                                np.random.default_rng(parsed.seed), stats, _hooks(request, runtime, control, stats))
    response, outcome = await write_generation(
        request, parsed, _timed(tokens, started, request, runtime.name), stream, len(prompt_ids),
        headers={MODE_HEADER: SPECULATIVE}, extension=lambda: {"mode": SPECULATIVE, **stats.as_dict()})
    request.app[METRICS].tv_bound.labels(runtime.name).set(stats.max_tv_bound)
    summary.update(prompt_tokens=outcome.prompt_tokens, completion_tokens=outcome.completion_tokens,
                   finish_reason=outcome.finish_reason, **stats.as_dict())
    return response


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _generation(request, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _generation(request, COMPLETION)


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


async def status(request: web.Request) -> web.Response:
    """GET /speculoos/status: every route's mode, α, K, costs and why."""
    routes = []
    for runtime in request.app[RUNTIMES].values():
        tokenizer = runtime.tokenizer
        routes.append({
            "route": runtime.name,
            "upstream": runtime.route.upstream.url,
            "protocol": runtime.route.upstream.protocol,
            "draft": runtime.route.draft.model if runtime.route.draft else None,
            "exact_sampling": bool(runtime.target and runtime.target.exact_support),
            "tokenizer": None if tokenizer is None else {"compatible": tokenizer.compatible, "reason": tokenizer.reason},
            **runtime.controller.status(),
        })
    return web.json_response({"routes": routes})


async def passthrough_any(request: web.Request) -> web.StreamResponse:
    """Every other path and method: forwarded untouched to the route's upstream."""
    model = None
    if request.can_read_body and request.content_type == "application/json":
        try:
            body = json.loads(await request.read())
            model = body.get("model") if isinstance(body, dict) else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            model = None  # not ours to judge: the upstream answers malformed bodies itself
    runtime = _runtime_for(request, model if isinstance(model, str) else None)
    return await forward(request, runtime.upstream, extra_headers={MODE_HEADER: PASSTHROUGH})

