"""Serve one admitted request speculatively: its session (policy, events, random streams), its drafter and target
as the request asks for them, the rounds, and the answer with its shapers."""

from __future__ import annotations

import time
from collections.abc import Sequence

import structlog
from aiohttp import web

from proxy.control.policy import PinnedPolicy
from proxy.control.route import SPECULATIVE
from proxy.decode.events import Publisher
from proxy.decode.loop import speculative_tokens
from proxy.decode.session import RequestRandom, Session
from proxy.drafting.prediction import with_prediction
from proxy.observability.logs import SwitchLog
from proxy.observability.metrics import Metrics, RouteMetrics
from proxy.observability.request_stats import RequestStats
from proxy.server import live
from proxy.server.admit import Admitted, upstream_model
from proxy.server.runtime import METRICS, RouteRuntime
from proxy.targets.recording import LogprobRecorder
from proxy.wire.emit import GenerationOutcome, write_generation
from proxy.wire.logprobs import LogprobsWriter
from proxy.wire.shapers import PredictionCounts, Report, ResponseShaper
from proxy.wire.textstream import TextStream

log = structlog.get_logger("speculoos.request")


async def serve_speculatively(request: web.Request, runtime: RouteRuntime, admitted: Admitted, request_id: str,
                              started: float, headers: dict[str, str]) -> tuple[web.StreamResponse,
                                                                              GenerationOutcome, RequestStats]:
    """Answer the request from rounds of draft and verify; the answer, its outcome and the request's stats."""
    drafter, target = runtime.drafter, runtime.target
    assert drafter is not None and target is not None  # checked by admission
    parsed, metrics = admitted.parsed, request.app[METRICS]
    try:
        stats = RequestStats(plain_rate=lambda: runtime.controller.costs.plain_rate)
        session = _session(request.app, runtime, admitted, request_id, stats)
        # The answer's shapers apply in this order: log-probs before tool calls, whose chunks that carry log-probs
        # are never held back.
        shapers: list[ResponseShaper] = [_Latency(metrics, runtime.name, started)]
        if parsed.logprobs is not None:  # recorded as the target scores
            target = recorder = LogprobRecorder(target, admitted.prompt_ids, runtime.route.speculation.top_logprobs)
            shapers.append(LogprobsWriter(parsed.kind, parsed.logprobs, drafter.vocabulary.token_bytes,
                                          recorder.lookup))
        shapers += [admitted.tools] if admitted.tools is not None else []
        shapers += [PredictionCounts(stats.prediction_counts)] if parsed.prediction else []
        shapers.append(Report(lambda: {"mode": SPECULATIVE, **stats.as_dict()}))
        drafting = with_prediction(drafter, parsed.prediction, len(admitted.prompt_ids))
        stream = TextStream(drafter.vocabulary.token_bytes, session.is_end(drafter), stop=parsed.stop,
                            max_tokens=admitted.max_tokens)
        tokens = speculative_tokens(session, drafting, target)
        response, outcome = await write_generation(request, parsed, tokens, stream, len(admitted.prompt_ids),
                                                   headers=headers, shapers=shapers)
    finally:
        drafter.release(request_id)
    metrics.tv_bound.labels(runtime.name).set(stats.max_tv_bound)
    return response, outcome, stats


def _session(app: web.Application, runtime: RouteRuntime, admitted: Admitted, request_id: str,
             stats: RequestStats) -> Session:
    """One request's session, its events going to the request's policy and stats, the route and the live view."""
    assert runtime.target is not None  # checked by admission
    shown = live.round_subscribers(app, request_id, runtime)
    controller, spec, control, parsed = runtime.controller, runtime.route.speculation, admitted.control, admitted.parsed
    pipelined = spec.pipeline if control.pipeline is None else control.pipeline
    chosen = not (control.pinned_k or control.forced)
    # The draft reads (the prompt while the target decodes the first tokens, then what the target writes) only where
    # it has cores of its own: taking turns, a reading hides nothing and delays the target, and the prompt is read
    # by the model's first draft if it ever drafts.
    warm_up = chosen and not runtime.takes_turns
    reads_along = warm_up and parsed.sampling_params.greedy
    # Taking turns, the target waits while the model's first draft reads the prompt.
    reads_first = len(admitted.prompt_ids) if runtime.takes_turns else 0
    policy = (PinnedPolicy(control.pinned_k) if control.pinned_k
              else controller.policy(forced=control.forced, pipelined=pipelined, reads_along=reads_along,
                                     reads_first=reads_first, max_tokens=admitted.max_tokens))
    # Only rounds the route's controller chose teach it: a client forcing or pinning K would steer everyone's mode.
    publish = Publisher([policy.observe, stats, *([controller.observe] if chosen else []),
                         RouteMetrics(app[METRICS], runtime.name, controller), SwitchLog(log), *shown])
    checked = runtime.tokenizer  # where the target ends a generation, as the tokenizer check learned it
    return Session(request_id=request_id, route=runtime.name, prompt_ids=admitted.prompt_ids,
                   max_tokens=admitted.max_tokens, params=parsed.sampling_params, order=runtime.target.order,
                   top_n=spec.top_logprobs, policy=policy, random=RequestRandom.from_seed(parsed.seed),
                   publish=publish, client_headers=admitted.client_headers, max_tv=spec.max_tv,
                   lookup_k=control.pinned_k or runtime.route.draft.k_max, pipeline=pipelined, warm_up=warm_up,
                   model=upstream_model(runtime, parsed),
                   ends=checked.stop.is_end if checked is not None and checked.stop is not None else None)


class _Latency(ResponseShaper):
    """Time to first token and inter-token latency, observed as the answer's tokens go out."""

    def __init__(self, metrics: Metrics, route: str, started: float) -> None:
        self._metrics, self._route, self._started = metrics, route, started
        self._last: float | None = None

    def add(self, tokens: Sequence[int]) -> None:
        now = time.perf_counter()
        if self._last is None:
            self._metrics.ttft.labels(self._route, SPECULATIVE).observe(now - self._started)
        elif tokens:
            self._metrics.itl.labels(self._route).observe((now - self._last) / len(tokens))
        self._last = now
