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
from dataclasses import dataclass, field, fields
from typing import Any

import structlog
from aiohttp import ClientConnectionResetError, web

from proxy.control.policy import PinnedPolicy
from proxy.decode.events import Publisher
from proxy.decode.loop import speculative_tokens
from proxy.decode.session import RequestRandom, Session
from proxy.drafting.base import Drafter, Source
from proxy.drafting.prediction import PredictionDrafter
from proxy.errors import BadRequestError
from proxy.observability.logs import SwitchLog
from proxy.observability.metrics import RouteMetrics
from proxy.observability.request_stats import RequestStats
from proxy.server import live
from proxy.server.admit import Admitted, admit, upstream_model
from proxy.server.in_flight import read_body
from proxy.server.passthrough import forward, upstream_body
from proxy.server.runtime import CONFIG, METRICS, RUNTIMES, RouteRuntime, runtime_for
from proxy.targets.base import Target
from proxy.targets.recording import LogprobRecorder
from proxy.wire.control import RequestControl, request_control
from proxy.wire.emit import write_generation
from proxy.wire.json_body import parse_body
from proxy.wire.logprobs import LogprobsWriter
from proxy.wire.request import CHAT, COMPLETION, GenerationRequest, parse_generation_request
from proxy.wire.response import prediction_details
from proxy.wire.textstream import TextStream

log = structlog.get_logger("speculoos.request")

SPECULATIVE = "speculative"
PASSTHROUGH = "passthrough"
MODE_HEADER = "X-Speculoos-Mode"


def _untouched(request: web.Request, body: Any) -> RouteRuntime | None:
    """The route that would forward this body untouched, so that the server judges its fields; else None."""
    if not (isinstance(body, dict) and isinstance(body.get("model"), str)) or (
            route := request.app[CONFIG].match(body["model"], request.path)) is None:
        return None
    runtime = request.app[RUNTIMES][route.name]
    speculates = runtime.speculates and route.speculation.enabled
    return runtime if not speculates or request_control(request.headers, body).off else None


@dataclass
class RequestSummary:
    """One generation request's log event: how it was served and how it ended."""

    kind: str
    stream: bool
    mode: str | None = None
    reason: str | None = None  # why it passed through
    status: int | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)  # a speculative generation's RequestStats

    def fields(self) -> dict[str, Any]:
        """The event's fields: those known, then the stats."""
        known = {item.name: getattr(self, item.name) for item in fields(self) if item.name != "stats"}
        return {**{name: value for name, value in known.items() if value is not None}, **self.stats}


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
    if runtime.target is not None:  # sampled as the server would sample it: its defaults in the fields left out
        parsed = runtime.target.with_defaults(parsed)
    request_id = uuid.uuid4().hex[:12]
    structlog.contextvars.bind_contextvars(request_id=request_id, route=runtime.name)
    live.begin(request, request_id, runtime.name, kind, body)
    summary = RequestSummary(kind, parsed.stream)
    try:
        forwarded = upstream_body(await request.read(), body, runtime.route)
        admitted = await admit(request, runtime, parsed, control, request_id)
        if isinstance(admitted, Admitted):
            summary.mode = SPECULATIVE
            response = await _speculate(request, runtime, parsed, control, admitted, summary, started, request_id)
        else:
            summary.mode, summary.reason = PASSTHROUGH, admitted
            response, summary.completion_tokens = await _pass(request, runtime, forwarded, started)
        summary.status = response.status
        request.app[METRICS].requests.labels(runtime.name, summary.mode).inc()
        return response
    except (asyncio.CancelledError, ClientConnectionResetError):  # gone mid-request, or mid-answer as it was written
        summary.status, summary.error = 499, "client disconnected"  # nginx's code for it
        raise
    except Exception as exc:
        summary.status, summary.error = getattr(exc, "status", 500), type(exc).__name__
        raise
    finally:
        event = summary.fields()
        live.end(request, event)
        log.info("request", ms=round((time.perf_counter() - started) * 1000, 1), **event)
        structlog.contextvars.clear_contextvars()


async def _pass(request: web.Request, runtime: RouteRuntime, body: bytes,
                started: float) -> tuple[web.StreamResponse, int | None]:
    """Passthrough, measuring the target's plain decoding rate on the way; the answer's completion tokens."""
    meter = live.passthrough_meter(request)
    response = await forward(request, runtime.upstream, body=body, extra_headers={MODE_HEADER: PASSTHROUGH},
                             meter=meter)
    tokens = meter.completion_tokens()
    if response.status == 200 and tokens and meter.first_byte is not None:
        if (seconds := meter.decoding_seconds(started)) is not None:
            runtime.controller.record_plain(tokens, seconds)
        request.app[METRICS].ttft.labels(runtime.name, PASSTHROUGH).observe(meter.first_byte - started)
        return response, tokens
    return response, None


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
                     control: RequestControl, admitted: Admitted, summary: RequestSummary,
                     started: float, request_id: str) -> web.StreamResponse:
    drafter, target, spec = runtime.drafter, runtime.target, runtime.route.speculation
    assert drafter is not None and target is not None  # checked by admission
    prompt_ids, max_tokens = admitted.prompt_ids, admitted.max_tokens
    try:
        session, stats = _session(request.app, runtime, parsed, control, request_id, admitted)
        stream = TextStream(drafter.vocabulary.token_bytes, session.is_end(drafter), stop=parsed.stop,
                            max_tokens=max_tokens)
        drafting = _with_prediction(drafter, parsed, len(prompt_ids))
        target, logprobs = _with_logprobs(target, parsed, prompt_ids, spec.top_logprobs, drafter.vocabulary.token_bytes)
        tokens = _timed(speculative_tokens(session, drafting, target), started, request, runtime.name)
        response, outcome = await write_generation(
            request, parsed, tokens, stream, len(prompt_ids), headers={MODE_HEADER: SPECULATIVE},
            extension=lambda: {"mode": SPECULATIVE, **stats.as_dict()},
            usage_details=_prediction_usage(stats) if parsed.prediction else None, logprobs=logprobs,
            tools=admitted.tools)
    finally:
        drafter.release(request_id)
    request.app[METRICS].tv_bound.labels(runtime.name).set(stats.max_tv_bound)
    summary.prompt_tokens, summary.completion_tokens = outcome.prompt_tokens, outcome.completion_tokens
    summary.finish_reason, summary.stats = outcome.finish_reason, stats.as_dict()
    summary.error = outcome.error  # the stream ended in-band: the status says 200, this says why it stopped
    return response


def _session(app: web.Application, runtime: RouteRuntime, parsed: GenerationRequest, control: RequestControl,
             request_id: str, admitted: Admitted) -> tuple[Session, RequestStats]:
    """One request's session, its events going to the request's policy and stats, the route and the metrics."""
    assert runtime.target is not None  # checked by admission
    controller, spec = runtime.controller, runtime.route.speculation
    stats = RequestStats(plain_rate=lambda: controller.costs.plain_rate)
    pipelined = spec.pipeline if control.pipeline is None else control.pipeline
    chosen = not (control.pinned_k or control.forced)
    # The draft reads (the prompt while the target decodes the first tokens, then what the target writes) only where
    # it has cores of its own: taking turns, a reading hides nothing and delays the target, and the prompt is read
    # by the model's first draft if it ever drafts.
    warm_up = chosen and not runtime.takes_turns
    reads_along = warm_up and parsed.sampling_params.greedy
    policy = (PinnedPolicy(control.pinned_k) if control.pinned_k
              else controller.policy(forced=control.forced, pipelined=pipelined, reads_along=reads_along))
    # Only rounds the route's controller chose teach it: a client forcing or pinning K would steer everyone's mode.
    publish = Publisher([policy.observe, stats, *([controller.observe] if chosen else []),
                         RouteMetrics(app[METRICS], runtime.name, controller), SwitchLog(log),
                         *live.round_subscribers(app, request_id, runtime)])
    session = Session(request_id=request_id, route=runtime.name, prompt_ids=admitted.prompt_ids,
                      max_tokens=admitted.max_tokens, params=parsed.sampling_params, order=runtime.target.order,
                      top_n=spec.top_logprobs, policy=policy, random=RequestRandom.from_seed(parsed.seed),
                      publish=publish, client_headers=admitted.client_headers, max_tv=spec.max_tv,
                      lookup_k=control.pinned_k or runtime.route.draft.k_max, pipeline=pipelined,
                      warm_up=warm_up, model=upstream_model(runtime, parsed), ends=_target_ends(runtime))
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


def _prediction_usage(stats: RequestStats) -> Callable[[], dict[str, int]]:
    """The usage's Predicted Outputs counts, from the request's prediction rounds."""
    def details() -> dict[str, int]:
        _, drafted, accepted = stats.by_source.get(Source.PREDICTION, (0, 0, 0))
        return prediction_details(drafted, accepted)

    return details


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
