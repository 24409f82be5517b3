"""`bench overhead`'s configurations, their routes and one measurement (the proxy's thread: overhead_proxy; the
fake target and the clients: overhead_load)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.bench.client import BenchError
from proxy.bench.overhead_load import Load
from proxy.bench.overhead_proxy import ProxyThread
from proxy.bench.overhead_target import SERVED_NAME
from proxy.config.schema import Config
from proxy.config.section import MAX_K
from proxy.observability.request_stats import RequestStats


@dataclass(frozen=True)
class Configuration:
    """One row of the table."""

    draft: str
    temperature: float
    k: int
    streams: int
    prompt_size: int  # the prompt's length asked for, in tokens (the row gives the length it came to)
    requests_per_stream: int
    max_tokens: int
    pinned: bool = False  # each request pins K (the route's controller then neither decides nor learns)

    @property
    def route(self) -> str:
        """The model name that reaches the route of its K."""
        return route_model(self.k)


@dataclass
class Measurement:
    """One configuration's raw figures."""

    cpu_seconds: float
    wall_seconds: float
    stage_seconds: dict[str, float]
    tally: RequestStats  # what the rounds and plain chunks published while measuring
    lag_seconds: float
    samples: list[tuple[float, int]] = field(default_factory=list)
    tokens: int = 0
    errors: list[str] = field(default_factory=list)
    collector_seconds: tuple[float, float] = (0.0, 0.0)  # the collector's CPU on the proxy thread: total, longest


def route_model(k: int) -> str:
    """The model name that reaches the route whose controller speculates at k."""
    return f"overhead-k{k}"


def draft_route(draft: str, gguf: str, upstream: str, streams: int, context_length: int,
                ks: Sequence[int]) -> Config:
    """One sglang route per K to the fake: suffix lookup (long paths allowed) or the model; no calibration; the
    draft on cores of its own (the fake computes nothing to take turns with). Each route's controller measures its
    costs and chooses K itself, as for any request it chose (a client's pinned K would leave it out)."""
    routes = []
    for k in ks:
        if draft == "lookup":  # a path may be as long as K after any match: rounds draft K as soon as a copy is found
            section: dict[str, Any] = {"kind": "suffix", "model": gguf, "k_max": k, "match_factor": float(MAX_K),
                                       "parallel": 1, "ctx": 512}
        else:
            section = {"kind": "model", "model": gguf, "parallel": streams, "ctx": context_length,
                       "shares_cores": False}
        routes.append({"name": route_model(k), "match": {"model": route_model(k)}, "draft": section,
                       "upstream": {"url": upstream, "protocol": "sglang", "model": SERVED_NAME},
                       "speculation": {"k": k, "top_logprobs": 20},
                       "fallback": {"calibrate": False, "k_min": k, "k_max": k}})
    return Config.model_validate({"server": {"port": 0}, "routes": routes})


async def warm_up(load: Load, url: str, prompt: str, configuration: Configuration) -> None:
    """One uncounted request, so first-call costs stay out of the figures."""
    _, errors = await load.clients(url, prompt, configuration, 1, 1)
    if errors:
        raise BenchError(f"warm-up request failed: {errors[0]}")


async def measure(proxy: ProxyThread, load: Load, prompt: str, configuration: Configuration) -> Measurement:
    """Run the configuration's clients between two readings of the proxy thread's clock."""
    cpu_start = await proxy.call(proxy.begin())
    started = time.perf_counter()
    tokens, errors = await load.clients(proxy.url, prompt, configuration, configuration.streams,
                                        configuration.requests_per_stream)
    wall = time.perf_counter() - started
    cpu_end, totals, tally, lag, samples, collector = await proxy.call(proxy.end())
    if errors:
        raise BenchError(f"{len(errors)} request(s) failed, first: {errors[0]}")
    return Measurement(cpu_end - cpu_start, wall, totals, tally, lag, samples, tokens, collector_seconds=collector)
