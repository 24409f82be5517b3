"""`bench overhead`'s machinery: the proxy in a thread of its own, the fake target, the clients, one measurement."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from proxy.bench import overhead_stages as stages
from proxy.bench.client import BenchError
from proxy.bench.overhead_target import SERVED_NAME, FakeState, fake_target_app
from proxy.config.schema import Config
from proxy.config.section import MAX_K
from proxy.decode.events import PlainEvent, Publisher, RoundEvent

# The loop monitor's sleep: its lateness is the loop's lag (any hold longer than a tick delays a wake-up). At 5 ms
# its wake-ups were most of a slow model round's "other" CPU.
LOOP_TICK_S = 0.010
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
    context_tokens: int
    requests: int
    max_tokens: int
    pinned: bool = False  # each request pins K (the route's controller then neither decides nor learns)


@dataclass
class Tally:
    """What the rounds and plain chunks published while measuring (updated on the proxy thread only)."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    draft_seconds: float = 0.0
    plain_chunks: int = 0
    plain_tokens: int = 0

    def add(self, event: object) -> None:
        """Count one published event."""
        if isinstance(event, RoundEvent):
            self.rounds += 1
            self.drafted += len(event.drafted)
            self.accepted += event.accepted
            self.emitted += len(event.emitted)
            self.draft_seconds += event.draft_seconds
        elif isinstance(event, PlainEvent):
            self.plain_chunks += 1
            self.plain_tokens += len(event.tokens)


@dataclass
class Measurement:
    """One configuration's raw figures."""

    cpu_seconds: float
    wall_seconds: float
    stage_seconds: dict[str, float]
    tally: Tally
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


class ProxyThread:
    """The proxy app served from a thread of its own, with its own loop; its CPU time is read inside that thread."""

    def __init__(self, config: Config, clock: stages.StageClock) -> None:
        self.config, self.clock, self.tally = config, clock, Tally()
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="speculoos-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._lag = 0.0
        self._samples: list[tuple[float, int]] = []
        self._monitor: asyncio.Task | None = None
        self._patches = contextlib.ExitStack()

    async def call(self, coroutine: Any) -> Any:
        """Run a coroutine on the proxy's loop and wait for it from this one."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self._loop))

    async def __aenter__(self) -> ProxyThread:
        tally = self.tally
        original = vars(Publisher)["__call__"]

        def counting(publisher: Publisher, event: Any) -> None:
            tally.add(event)
            original(publisher, event)

        self._patches.enter_context(_attribute(Publisher, "__call__", counting))
        self._patches.enter_context(stages.patched(self.clock, stages.proxy_stages()))
        self._thread.start()
        try:
            self.url = await self.call(self._serve())
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._runner is not None:
            await self.call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join)
        self._loop.close()
        self._patches.close()

    async def _serve(self) -> str:
        from proxy.server.app import create_app  # the proxy's modules, only once the command runs

        self.clock.thread = threading.get_ident()
        self._runner = web.AppRunner(create_app(self.config), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._monitor = asyncio.get_running_loop().create_task(self._watch())
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _close(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
        assert self._runner is not None
        await self._runner.cleanup()

    async def _watch(self) -> None:
        """Sleep a tick at a time: how late each wake-up is, is how long a ready callback waited."""
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(LOOP_TICK_S)
            self._lag = max(self._lag, loop.time() - before - LOOP_TICK_S)
            self._samples.append((time.thread_time(), self.tally.rounds))

    async def begin(self) -> float:
        """Zero the counters (on the proxy thread); the thread's CPU time now."""
        self.clock.reset()
        self.tally.__init__()  # type: ignore[misc]
        self._lag, self._samples = 0.0, [(time.thread_time(), 0)]
        return time.thread_time()

    async def end(self) -> tuple[float, dict[str, float], Tally, float, list[tuple[float, int]]]:
        """The thread's CPU time now, and what was counted since begin()."""
        now = time.thread_time()
        tally = Tally(**vars(self.tally))
        return now, dict(self.clock.totals), tally, self._lag, [*self._samples, (now, tally.rounds)]


@contextlib.contextmanager
def _attribute(owner: object, name: str, value: Any) -> Any:
    """Set an attribute for the duration."""
    original = vars(owner)[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


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
    tokens, errors = await _clients(proxy.url, prompt, configuration, configuration.requests)
    wall = time.perf_counter() - started
    cpu_end, totals, tally, lag, samples = await proxy.call(proxy.end())
    if errors:
        raise BenchError(f"{len(errors)} request(s) failed, first: {errors[0]}")
    return Measurement(cpu_end - cpu_start, wall, totals, tally, lag, samples, tokens)
