"""Chat and completions: parse -> admit -> run the session -> emit (other paths: other_paths.py).

Each generation request is routed, then served in one of two modes (one structured log event says which, and why):
- speculative: prompt ids from the upstream's /tokenize, rounds of draft + verify, emitted here (and continued by
  plain decoding on the target if speculation stops paying mid-stream);
- passthrough: the original request forwarded untouched.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import structlog
from aiohttp import ClientConnectionResetError, web

from proxy.admission import RouteSnapshot, passthrough_reason
from proxy.control.policy import PinnedPolicy
from proxy.decode.events import Publisher
from proxy.decode.loop import speculative_tokens
from proxy.decode.session import RequestRandom, Session
from proxy.drafting.base import Drafter
from proxy.drafting.prediction import PREDICTION, PredictionDrafter
from proxy.errors import BadRequestError
from proxy.observability.logs import SwitchLog
from proxy.observability.metrics import RouteMetrics
from proxy.observability.request_stats import RequestStats
from proxy.server import guard, live
from proxy.server.in_flight import read_body
from proxy.server.passthrough import forward, upstream_body
from proxy.server.runtime import CONFIG, METRICS, RUNTIMES, RouteRuntime, runtime_for
from proxy.targets.base import Target
from proxy.targets.recording import LogprobRecorder
from proxy.wire.control import RequestControl, request_control
from proxy.wire.emit import write_generation
from proxy.wire.json_body import parse_body
from proxy.wire.keys import key_headers
from proxy.wire.logprobs import LogprobsWriter
from proxy.wire.request import CHAT, COMPLETION, GenerationRequest, parse_generation_request
from proxy.wire.response import prediction_details
from proxy.wire.textstream import TextStream
from proxy.wire.tool_stream import ToolCallStream
from proxy.wire.tools import format_problem, parses_tool_calls, prompt_text

log = structlog.get_logger("speculoos.request")

SPECULATIVE = "speculative"
PASSTHROUGH = "passthrough"
MODE_HEADER = "X-Speculoos-Mode"


async def _admit(runtime: RouteRuntime, parsed: GenerationRequest, control: RequestControl) -> str | None:
    """Why this request is not served speculatively, or None if it is."""
    snapshot = RouteSnapshot(runtime.route.speculation, runtime.drafter is not None, runtime.target,
                             runtime.drafter.vocabulary.n_vocab if runtime.drafter is not None else None)
    if (reason := passthrough_reason(snapshot, parsed, control)) is not None:
        return reason
    if (mismatch := await runtime.tokenizer_problem()) is not None:
        return mismatch
    if control.forced or parsed.prediction:
        return None  # a prediction drafts as lookups do, at their cost: the request decides round by round
    speculate, why = runtime.controller.start_request()
    return None if speculate else f"controller: {why}"


def _untouched(request: web.Request, body: Any) -> RouteRuntime | None:
    """The route that would forward this body untouched, so that the server judges its fields; else None."""
    if not (isinstance(body, dict) and isinstance(body.get("model"), str)) or (
            route := request.app[CONFIG].match(body["model"], request.path)) is None:
        return None
    runtime = request.app[RUNTIMES][route.name]
    speculates = runtime.speculates and route.speculation.enabled
    return runtime if not speculates or request_control(request.headers, body).off else None


async def _generation(request: web.Request, kind: str) -> web.StreamResponse:
    started = time.perf_counter()
    body = await parse_body(await read_body(request))
    try:
        parsed = parse_generation_request(body, kind)  # type: ignore[arg-type]
    except BadRequestError:
        if (untouched := _untouched(request, body)) is None:
            raise
        forwarded = upstream_body(await request.read(), body, untouched.route)
        return await forward(request, untouched.upstream, body=forwarded, extra_headers={MODE_HEADER: PASSTHROUGH})
    control = request_control(request.headers, body)
    runtime = runtime_for(request, parsed.model)
    request_id = uuid.uuid4().hex[:12]
    structlog.contextvars.bind_contextvars(request_id=request_id, route=runtime.name)
    live.begin(request, request_id, runtime.name, kind, body)
    summary: dict[str, Any] = {"kind": kind, "stream": parsed.stream}
    try:
        reason = await _admit(runtime, parsed, control)
        forwarded = upstream_body(await request.read(), body, runtime.route)
        if reason is None:
            summary["mode"] = SPECULATIVE
            response = await _speculate(request, runtime, parsed, control, forwarded, summary, started, request_id)
        else:
            summary.update(mode=PASSTHROUGH, reason=reason)
            response = await _pass(request, runtime, forwarded, started, summary)
        summary["status"] = response.status
        request.app[METRICS].requests.labels(runtime.name, summary["mode"]).inc()
        return response
    except (asyncio.CancelledError, ClientConnectionResetError):  # gone mid-request, or mid-answer as it was written
        summary.update(status=499, error="client disconnected")  # nginx's code for it
        raise
    except Exception as exc:
        summary.update(status=getattr(exc, "status", 500), error=type(exc).__name__)
        raise
    finally:
        live.end(request, summary)
        log.info("request", ms=round((time.perf_counter() - started) * 1000, 1), **summary)
        structlog.contextvars.clear_contextvars()


async def _pass(request: web.Request, runtime: RouteRuntime, body: bytes, started: float,
                summary: dict[str, Any]) -> web.StreamResponse:
    """Passthrough, measuring the target's plain decoding rate on the way."""
    meter = live.passthrough_meter(request)
    response = await forward(request, runtime.upstream, body=body, extra_headers={MODE_HEADER: PASSTHROUGH},
                             meter=meter)
    tokens = meter.completion_tokens()
    if response.status == 200 and tokens and meter.first_byte is not None:
        if (seconds := meter.decoding_seconds(started)) is not None:
            runtime.controller.record_plain(tokens, seconds)
        request.app[METRICS].ttft.labels(runtime.name, PASSTHROUGH).observe(meter.first_byte - started)
        summary["completion_tokens"] = tokens
    return response


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
                     started: float, request_id: str) -> web.StreamResponse:
    drafter, target, spec = runtime.drafter, runtime.target, runtime.route.speculation
    assert drafter is not None and target is not None  # checked by admission
    client_headers = key_headers(request.headers) or None  # the client's key, in whichever header it came
    # Tokenized for the model verified against, and a completion's prompt as parsed (a batch of one unwrapped).
    named = {**parsed.body, "model": _upstream_model(runtime, parsed)}
    if parsed.kind == COMPLETION:
        named["prompt"] = parsed.prompt
    prompt_ids, context_size = await target.prompt_ids(named, parsed.kind, client_headers)
    max_tokens = parsed.max_tokens_within(len(prompt_ids), context_size, "the upstream's")
    # The output may outgrow the draft's context: the model's drafts then stop, and the rest is decoded plainly or
    # drafted by lookups (the loop). Only a prompt the model cannot read at all passes through.
    tools = _tool_calls(parsed, drafter, prompt_ids)
    if isinstance(tools, str):  # tools in the prompt, but no call format the proxy reads
        summary.update(mode=PASSTHROUGH, reason=tools)
        return await _pass(request, runtime, forwarded, started, summary)
    if not drafter.fits(len(prompt_ids) + spec.k):
        summary.update(mode=PASSTHROUGH, reason="the prompt exceeds the draft's context")
        return await _pass(request, runtime, forwarded, started, summary)
    if not drafter.reserve(request_id, prompt_ids, tenant=guard.tenant(request.headers)):
        summary.update(mode=PASSTHROUGH, reason="every draft sequence is in use")
        return await _pass(request, runtime, forwarded, started, summary)
    try:
        session, stats = _session(request.app, runtime, parsed, control, request_id, prompt_ids, max_tokens,
                                  client_headers)
        stream = TextStream(drafter.vocabulary.token_bytes, session.is_end(drafter), stop=parsed.stop,
                            max_tokens=max_tokens)
        drafting = _with_prediction(drafter, parsed, len(prompt_ids))
        target, logprobs = _with_logprobs(target, parsed, prompt_ids, spec.top_logprobs, drafter.vocabulary.token_bytes)
        tokens = _timed(speculative_tokens(session, drafting, target), started, request, runtime.name)
        response, outcome = await write_generation(
            request, parsed, tokens, stream, len(prompt_ids), headers={MODE_HEADER: SPECULATIVE},
            extension=lambda: {"mode": SPECULATIVE, **stats.as_dict()},
            usage_details=_prediction_usage(stats) if parsed.prediction else None, logprobs=logprobs, tools=tools)
    finally:
        drafter.release(request_id)
    request.app[METRICS].tv_bound.labels(runtime.name).set(stats.max_tv_bound)
    summary.update(prompt_tokens=outcome.prompt_tokens, completion_tokens=outcome.completion_tokens,
                   finish_reason=outcome.finish_reason, **stats.as_dict())
    if outcome.error is not None:  # the stream ended in-band: the status says 200, this says why it stopped
        summary["error"] = outcome.error
    return response


def _session(app: web.Application, runtime: RouteRuntime, parsed: GenerationRequest, control: RequestControl,
             request_id: str, prompt_ids: list[int], max_tokens: int,
             client_headers: dict[str, str] | None) -> tuple[Session, RequestStats]:
    """One request's session, its events going to the request's policy and stats, the route and the metrics."""
    assert runtime.target is not None  # checked by admission
    controller, spec = runtime.controller, runtime.route.speculation
    stats = RequestStats(plain_rate=lambda: controller.costs.plain_rate)
    pipelined = spec.pipeline if control.pipeline is None else control.pipeline
    warm_up = chosen = not (control.pinned_k or control.forced)
    # Reading along is free only where the draft has cores of its own: taking turns, it would delay the target.
    reads_along = warm_up and parsed.sampling_params.greedy and not runtime.takes_turns
    policy = (PinnedPolicy(control.pinned_k) if control.pinned_k
              else controller.policy(forced=control.forced, pipelined=pipelined, reads_along=reads_along))
    # Only rounds the route's controller chose teach it: a client forcing or pinning K would steer everyone's mode.
    publish = Publisher([policy.observe, stats, *([controller.observe] if chosen else []),
                         RouteMetrics(app[METRICS], runtime.name, controller), SwitchLog(log),
                         *live.round_subscribers(app, request_id, runtime)])
    session = Session(request_id=request_id, route=runtime.name, prompt_ids=prompt_ids, max_tokens=max_tokens,
                      params=parsed.sampling_params, order=runtime.target.order, top_n=spec.top_logprobs,
                      policy=policy, random=RequestRandom.from_seed(parsed.seed), publish=publish,
                      client_headers=client_headers, max_tv=spec.max_tv,
                      lookup_k=control.pinned_k or runtime.route.draft.k_max, pipeline=pipelined,
                      warm_up=warm_up, model=_upstream_model(runtime, parsed), ends=_target_ends(runtime))
    return session, stats


def _with_prediction(drafter: Drafter, parsed: GenerationRequest, prompt_length: int) -> Drafter:
    """The route's drafter, behind the request's prediction if it sent one (tokenized once, in the draft's
    vocabulary, which the tokenizer check found to be the target's)."""
    if not parsed.prediction:
        return drafter
    return PredictionDrafter(drafter, drafter.vocabulary.tokenize(parsed.prediction, add_special=False),
                             prompt_length)


def _with_logprobs(target: Target, parsed: GenerationRequest, prompt_ids: list[int], top_n: int,
                   token_bytes: Callable[[int], bytes]) -> tuple[Target, LogprobsWriter | None]:
    """The route's target, recording its log-probs when the client asks for them, and their writer."""
    if parsed.logprobs is None:
        return target, None
    recorder = LogprobRecorder(target, prompt_ids, top_n)
    return recorder, LogprobsWriter(parsed.kind, parsed.logprobs, token_bytes, recorder.lookup)  # type: ignore[return-value]


def _tool_calls(parsed: GenerationRequest, drafter: Drafter, prompt_ids: list[int]) -> ToolCallStream | str | None:
    """The reader of the answer's tool calls when its output is parsed for them, or why the prompt the target
    rendered has no format it reads (the draft's vocabulary is the target's: the tokenizer check)."""
    if parsed.kind != CHAT or not parses_tool_calls(parsed.body):
        return None
    return format_problem(prompt_text(drafter.vocabulary.token_bytes, prompt_ids)) or ToolCallStream()


def _prediction_usage(stats: RequestStats) -> Callable[[], dict[str, int]]:
    """The usage's Predicted Outputs counts, from the request's prediction rounds."""
    def details() -> dict[str, int]:
        _, drafted, accepted = stats.by_source.get(PREDICTION, (0, 0, 0))
        return prediction_details(drafted, accepted)

    return details


def _upstream_model(runtime: RouteRuntime, parsed: GenerationRequest) -> str:
    """The model the upstream is asked for, as passthrough forwards it: a LoRA adapter is verified as itself."""
    return runtime.route.upstream.model or parsed.model


def _target_ends(runtime: RouteRuntime) -> Callable[[int], bool] | None:
    """Where the route's target ends a generation, as the tokenizer check learned it from the upstream."""
    verdict = runtime.tokenizer
    return verdict.stop.is_end if verdict is not None and verdict.stop is not None else None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _generation(request, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _generation(request, COMPLETION)
