"""`bench overhead`'s machinery: the fake target, the clients, one measurement (the proxy's thread: overhead_proxy)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from proxy.bench.client import BenchError
from proxy.bench.overhead_proxy import ProxyThread
from proxy.bench.overhead_target import SERVED_NAME, FakeState, fake_target_app
from proxy.config.schema import Config
from proxy.config.section import MAX_K
from proxy.observability.request_stats import RequestStats

SAMPLED_TOP_K = 20  # sampled requests send top_k within the route's top-20: exact on a stock SGLang
TIMEOUT_S = 600.0
SEED = 1234


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


@contextlib.asynccontextmanager
async def serve_fake(acceptance: float, vocab_size: int, tokenize: Callable[[str, bool], list[int]],
                     context_length: int, step_seconds: float = 0.0) -> AsyncIterator[str]:
    """The fake SGLang on a loopback port of this thread's loop; yields its URL."""
    state = FakeState(acceptance, vocab_size, np.random.default_rng(SEED), tokenize, context_length, step_seconds)
    runner = web.AppRunner(fake_target_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def request_body(prompt: str, configuration: Configuration, seed: int) -> dict[str, Any]:
    """A streamed completion with the configuration's temperature."""
    body: dict[str, Any] = {"model": route_model(configuration.k), "prompt": prompt,
                            "max_tokens": configuration.max_tokens, "temperature": configuration.temperature,
                            "stream": True, "stream_options": {"include_usage": True}, "seed": seed}
    if configuration.temperature > 0:
        body["top_k"] = SAMPLED_TOP_K
    if configuration.pinned:
        body["speculoos"] = {"k": configuration.k}
    return body


async def _send(session: aiohttp.ClientSession, url: str, prompt: str, configuration: Configuration,
                seed: int) -> tuple[int, str | None]:
    """One request: (completion tokens, error or None); a passthrough is an error here."""
    async with session.post(url + "/v1/completions", json=request_body(prompt, configuration, seed)) as reply:
        if reply.status != 200:
            return 0, f"HTTP {reply.status}: {(await reply.text())[:200]}"
        if reply.headers.get("X-Speculoos-Mode") != "speculative":
            return 0, "the proxy passed the request through"
        tokens = 0
        async for line in reply.content:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if "error" in chunk:
                    return tokens, str(chunk["error"])[:200]
        return tokens, None


async def _clients(url: str, prompt: str, configuration: Configuration, requests: int) -> tuple[int, list[str]]:
    """`streams` clients, each sending `requests` requests one after another."""
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        async def client(index: int) -> list[tuple[int, str | None]]:
            return [await _send(session, url, prompt, configuration, SEED + index * requests + n)
                    for n in range(requests)]
        results = await asyncio.gather(*(client(i) for i in range(configuration.streams)))
    flat = [result for per_client in results for result in per_client]
    return sum(tokens for tokens, _ in flat), [error for _, error in flat if error]


async def warm_up(url: str, prompt: str, configuration: Configuration) -> None:
    """One uncounted request, so first-call costs stay out of the figures."""
    _, errors = await _clients(url, prompt, Configuration(**{**vars(configuration), "streams": 1}), 1)
    if errors:
        raise BenchError(f"warm-up request failed: {errors[0]}")


async def measure(proxy: ProxyThread, prompt: str, configuration: Configuration) -> Measurement:
    """Run the configuration's clients between two readings of the proxy thread's clock."""
    cpu_start = await proxy.call(proxy.begin())
    started = time.perf_counter()
    tokens, errors = await _clients(proxy.url, prompt, configuration, configuration.requests_per_stream)
    wall = time.perf_counter() - started
    cpu_end, totals, tally, lag, samples = await proxy.call(proxy.end())
    if errors:
        raise BenchError(f"{len(errors)} request(s) failed, first: {errors[0]}")
    return Measurement(cpu_end - cpu_start, wall, totals, tally, lag, samples, tokens)
