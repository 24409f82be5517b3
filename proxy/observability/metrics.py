"""Prometheus metrics: vLLM's speculative-decoding counters with a `speculoos_` prefix, and ours.

One registry per app (no global state), rendered at GET /metrics; a route's rounds reach it as a
subscriber of the generation's events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from proxy.control.route import PASSTHROUGH, SPECULATIVE, RouteController
from proxy.decode.events import Event, RoundEvent, SwitchEvent

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class Metrics:
    """Every metric the proxy exports, in one registry."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    # Each round updates a dozen labelled series: prometheus_client's labels() validates and locks on every call,
    # so each series is looked up once. A route's decision is set again only when it changed.
    _series: dict[tuple[int, tuple[str, ...]], Any] = field(default_factory=dict, init=False, repr=False)
    _decisions: dict[str, tuple[int, float | None]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        r, route = self.registry, ["route"]
        # Names follow vLLM's spec-decode metrics (vllm/v1/spec_decode/metrics.py), prefixed.
        self.num_drafts = Counter("speculoos_spec_decode_num_drafts", "Speculative rounds with drafts",
                                  route, registry=r)
        self.num_draft_tokens = Counter("speculoos_spec_decode_num_draft_tokens", "Drafted tokens", route, registry=r)
        self.num_accepted_tokens = Counter("speculoos_spec_decode_num_accepted_tokens", "Accepted draft tokens",
                                           route, registry=r)
        self.accepted_per_pos = Counter("speculoos_spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted draft tokens by position", ["route", "position"], registry=r)
        self.requests = Counter("speculoos_requests", "Requests by route and mode", ["route", "mode"], registry=r)
        self.ttft = Histogram("speculoos_time_to_first_token_seconds", "Time to first token", ["route", "mode"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("speculoos_inter_token_latency_seconds", "Time between emitted tokens", route,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.draft_time = Histogram("speculoos_draft_seconds", "Draft time per round", route,
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.verify_time = Histogram("speculoos_verify_seconds", "Verification time per round", route,
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.alpha = Gauge("speculoos_acceptance_rate", "EWMA acceptance rate α", route, registry=r)
        self.chosen_k = Gauge("speculoos_chosen_k", "K chosen by the controller (0 = passthrough)", route, registry=r)
        self.mode = Gauge("speculoos_mode", "1 for the route's current mode", ["route", "mode"], registry=r)
        self.tv_bound = Gauge("speculoos_sampling_tv_bound", "Largest total-variation bound of the last bounded "
                              "request (0 when exact)", route, registry=r)
        self.mid_stream_switches = Counter("speculoos_mid_stream_switches", "Generations continued by plain decoding",
                                           route, registry=r)

    def series(self, metric: Any, *labels: str) -> Any:
        """metric.labels(*labels), looked up once."""
        key = (id(metric), labels)
        child = self._series.get(key)
        if child is None:
            child = self._series[key] = metric.labels(*labels)
        return child

    def record_round(self, route: str, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """One speculative round."""
        if drafted:
            self.series(self.num_drafts, route).inc()
            self.series(self.num_draft_tokens, route).inc(drafted)
            self.series(self.num_accepted_tokens, route).inc(accepted)
            for position in range(accepted):
                self.series(self.accepted_per_pos, route, str(position)).inc()
        self.series(self.draft_time, route).observe(draft_s)
        self.series(self.verify_time, route).observe(verify_s)

    def set_decision(self, route: str, k: int, alpha: float | None) -> None:
        """The controller's current choice."""
        if self._decisions.get(route) == (k, alpha):
            return
        self._decisions[route] = (k, alpha)
        self.series(self.chosen_k, route).set(k)
        for mode in (SPECULATIVE, PASSTHROUGH):
            self.series(self.mode, route, mode).set(1 if (mode == SPECULATIVE) == (k > 0) else 0)
        if alpha is not None:
            self.series(self.alpha, route).set(alpha)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


@dataclass(frozen=True)
class RouteMetrics:
    """A subscriber that counts a route's rounds and switches and shows the route's decision."""

    metrics: Metrics
    route: str
    controller: RouteController

    def __call__(self, event: Event) -> None:
        if isinstance(event, RoundEvent):
            self.metrics.record_round(self.route, len(event.drafted), event.accepted, event.draft_seconds,
                                      event.verify_seconds)
            self.metrics.set_decision(self.route, self.controller.current.k, self.controller.costs.alpha.value)
        elif isinstance(event, SwitchEvent):
            self.metrics.mid_stream_switches.labels(self.route).inc()
