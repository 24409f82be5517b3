"""The proxy's HTTP handlers: OpenAI generation (speculative or passthrough), /v1/models, and the rest.

Each generation request is routed, then served in one of two modes:
- speculative: prompt ids from the upstream's /tokenize, rounds of draft + verify, emitted here;
- passthrough: the original request forwarded untouched.
One structured log event per request says which, and why.
"""

from __future__ import annotations

import json
import time
import uuid
from fnmatch import fnmatchcase
from typing import Any

import numpy as np
import structlog
from aiohttp import web

from proxy.errors import BadRequestError, ContextOverflowError, NotFoundError, UpstreamError
from proxy.openai_wire import CHAT, COMPLETION, GenerationRequest, parse_generation_request, write_generation
from proxy.passthrough import forward
from proxy.sampling import SamplingParams
from proxy.speculate import RoundPlan, RoundStats, speculative_tokens
from proxy.state import CONFIG, RUNTIMES, RouteRuntime
from proxy.targets.topn import bound_problem, exactness_problem
from proxy.textstream import TextStream

log = structlog.get_logger("speculoos.request")

SPECULATIVE = "speculative"
PASSTHROUGH = "passthrough"
MODE_HEADER = "X-Speculoos-Mode"
OPT_OUT_HEADER = "X-Speculoos"


def _runtime_for(request: web.Request, model: str | None) -> RouteRuntime:
    route = request.app[CONFIG].match(model, request.path)
    if route is None:
        raise NotFoundError(f"no route serves model {model!r} on {request.path}", param="model")
    return request.app[RUNTIMES][route.name]


async def _tokenizer_verdict(runtime: RouteRuntime) -> str | None:
    """Run the tokenizer check if start-up could not reach the upstream; the reason not to speculate."""
    if runtime.tokenizer is None and runtime.draft is not None:
        try:
            await runtime.inspect_upstream()
        except UpstreamError:
            return "tokenizer check pending: upstream unreachable"
        if runtime.tokenizer is not None and not runtime.tokenizer.compatible:
            log.warning("tokenizer_mismatch", route=runtime.name, reason=runtime.tokenizer.reason)
    if runtime.tokenizer is not None and not runtime.tokenizer.compatible:
        return f"tokenizer mismatch: {runtime.tokenizer.reason}"
    return None


async def _passthrough_reason(request: web.Request, runtime: RouteRuntime, parsed: GenerationRequest) -> str | None:
    """Why this request cannot be served speculatively, or None if it can."""
    if runtime.draft is None or runtime.target is None:
        return "route has no draft model" if runtime.draft is None else "upstream protocol cannot verify"
    if not runtime.route.speculation.enabled:
        return "speculation disabled for this route"
    if request.headers.get(OPT_OUT_HEADER, "").lower() == "off":
        return "client opted out (X-Speculoos: off)"
    if parsed.unsupported:
        return "parameters only the upstream can honour: " + ", ".join(parsed.unsupported)
    if not runtime.target.exact_support:
        spec = runtime.route.speculation
        problem = exactness_problem(sampling_params(parsed), spec.top_logprobs, runtime.target.order)
        if problem is not None and spec.sampling == "exact":
            return f"cannot be exact: {problem}"
        if problem is not None and (bounded := bound_problem(sampling_params(parsed))) is not None:
            return f"cannot be bounded: {bounded}"
    return await _tokenizer_verdict(runtime)


def sampling_params(parsed: GenerationRequest) -> SamplingParams:
    """The request's sampling parameters."""
    return SamplingParams(parsed.temperature, parsed.top_k, parsed.top_p, parsed.min_p)


def _upstream_body(raw: bytes, body: dict, runtime: RouteRuntime) -> bytes:
    """The body to forward: unchanged unless the route renames the model."""
    if runtime.route.upstream.model is None:
        return raw
    return json.dumps({**body, "model": runtime.route.upstream.model}).encode()


async def _generation(request: web.Request, kind: str) -> web.StreamResponse:
    started = time.perf_counter()
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequestError(f"the request body is not valid JSON: {exc}") from exc
    parsed = parse_generation_request(body, kind)  # type: ignore[arg-type]
    runtime = _runtime_for(request, parsed.model)
    structlog.contextvars.bind_contextvars(request_id=uuid.uuid4().hex[:12], route=runtime.name)
    summary: dict[str, Any] = {"kind": kind, "stream": parsed.stream}
    try:
        reason = await _passthrough_reason(request, runtime, parsed)
        if reason is not None:
            summary.update(mode=PASSTHROUGH, reason=reason)
            response = await forward(request, runtime.upstream, body=_upstream_body(raw, body, runtime),
                                     extra_headers={MODE_HEADER: PASSTHROUGH})
            summary["status"] = response.status
            return response
        summary["mode"] = SPECULATIVE
        response = await _speculate(request, runtime, parsed, summary)
        summary["status"] = response.status
        return response
    except Exception as exc:
        summary.update(status=getattr(exc, "status", 500), error=type(exc).__name__)
        raise
    finally:
        log.info("request", ms=round((time.perf_counter() - started) * 1000, 1), **summary)
        structlog.contextvars.clear_contextvars()


async def _speculate(request: web.Request, runtime: RouteRuntime, parsed: GenerationRequest,
                     summary: dict[str, Any]) -> web.StreamResponse:
    assert runtime.draft is not None and runtime.target is not None  # checked by _passthrough_reason
    draft, spec = runtime.draft, runtime.route.speculation
    client_headers = {k: v for k, v in request.headers.items() if k == "Authorization"}
    prompt_ids, context_size = await runtime.target.prompt_ids(parsed.body, parsed.kind, client_headers)
    room = context_size - len(prompt_ids)
    if room < 1 or (parsed.max_tokens or 0) > room:
        raise ContextOverflowError(
            f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({parsed.max_tokens}) exceed the "
            f"upstream's context of {context_size} tokens", param="max_tokens")
    max_tokens = parsed.max_tokens or room
    if not draft.fits(len(prompt_ids) + max_tokens + spec.k):
        summary.update(mode=PASSTHROUGH, reason="prompt + max_tokens exceed the draft's context")
        return await forward(request, runtime.upstream, extra_headers={MODE_HEADER: PASSTHROUGH})
    plan = RoundPlan(spec.k, sampling_params(parsed), runtime.target.order, spec.top_logprobs, client_headers)
    stats = RoundStats()
    stream = TextStream(draft.engine.token_bytes, draft.engine.is_end_of_generation,
                        stop=parsed.stop, max_tokens=max_tokens)
    tokens = speculative_tokens(draft, runtime.target, prompt_ids, max_tokens, plan,
                                np.random.default_rng(parsed.seed), stats)
    response, outcome = await write_generation(
        request, parsed, tokens, stream, len(prompt_ids),
        headers={MODE_HEADER: SPECULATIVE}, extension=lambda: {"mode": SPECULATIVE, **stats.as_dict()})
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
