"""`bench overhead`'s proxy: the app served from a thread of its own, its CPU time, its loop's lag, the garbage
collector's share, and what its rounds published while measuring."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import threading
import time
from typing import Any

from aiohttp import web

from proxy.bench import overhead_stages as stages
from proxy.config.schema import Config
from proxy.decode.events import Publisher
from proxy.observability.request_stats import RequestStats

# The loop monitor's sleep: its lateness is the loop's lag (any hold longer than a tick delays a wake-up). At 5 ms
# its wake-ups were most of a slow model round's "other" CPU.
LOOP_TICK_S = 0.010


class CollectorClock:
    """The CPU time of the garbage collector's runs on one thread (a gc callback): their total and the longest."""

    def __init__(self) -> None:
        self.thread = 0
        self.total = self.longest = 0.0
        self._started: float | None = None

    def __call__(self, phase: str, _info: dict[str, int]) -> None:
        if threading.get_ident() != self.thread:
            return
        if phase == "start":
            self._started = time.thread_time()
        elif self._started is not None:
            spent, self._started = time.thread_time() - self._started, None
            self.total, self.longest = self.total + spent, max(self.longest, spent)

    def reset(self) -> None:
        """Count from now."""
        self.total = self.longest = 0.0


class ProxyThread:
    """The proxy app served from a thread of its own, with its own loop; its CPU time is read inside that thread."""

    def __init__(self, config: Config, clock: stages.StageClock) -> None:
        self.config, self.clock, self.tally = config, clock, RequestStats()
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="speculoos-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._lag = 0.0
        self._samples: list[tuple[float, int]] = []
        self._monitor: asyncio.Task | None = None
        self._patches = contextlib.ExitStack()
        self.collector = CollectorClock()

    async def call(self, coroutine: Any) -> Any:
        """Run a coroutine on the proxy's loop and wait for it from this one."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self._loop))

    async def __aenter__(self) -> ProxyThread:
        tally = self.tally
        original = vars(Publisher)["__call__"]

        def counting(publisher: Publisher, event: Any) -> None:
            tally(event)
            original(publisher, event)

        self._patches.enter_context(_attribute(Publisher, "__call__", counting))
        self._patches.enter_context(stages.patched(self.clock, stages.proxy_stages()))
        gc.callbacks.append(self.collector)
        self._patches.callback(gc.callbacks.remove, self.collector)
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

        self.clock.thread = self.collector.thread = threading.get_ident()
        self._runner = web.AppRunner(create_app(self.config, settle_heap=True),  # the collector as `serve` tunes it
                                     access_log=None, handler_cancellation=True)
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
        self.collector.reset()
        self.tally.__init__()  # type: ignore[misc]
        self._lag, self._samples = 0.0, [(time.thread_time(), 0)]
        return time.thread_time()

    async def end(self) -> tuple[float, dict[str, float], RequestStats, float, list[tuple[float, int]],
                                 tuple[float, float]]:
        """The thread's CPU time now, and what was counted since begin() (the collector's: total, longest)."""
        now = time.thread_time()
        tally = copy.copy(self.tally)
        collector = (self.collector.total, self.collector.longest)
        return now, dict(self.clock.totals), tally, self._lag, [*self._samples, (now, tally.rounds)], collector


@contextlib.contextmanager
def _attribute(owner: object, name: str, value: Any) -> Any:
    """Set an attribute for the duration."""
    original = vars(owner)[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)
