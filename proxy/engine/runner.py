"""One engine behind one worker thread: how async code calls blocking llama.cpp, one call at a time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from proxy.engine.gate import DRAFT, CoreGate
from proxy.engine.llama import LlamaEngine

T = TypeVar("T")


@dataclass(frozen=True)
class _Failed:
    """A chained step's exception, carried to the event loop."""

    error: BaseException


class EngineRunner:
    """Runs an engine's blocking calls on one worker thread, so they never overlap."""

    def __init__(self, engine: LlamaEngine) -> None:
        self.engine = engine
        self.gate: CoreGate | None = None  # set when this (draft) engine takes turns with its target on shared cores
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking call on the engine's thread."""
        return await self.submit(fn, *args)

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue a blocking call now (calls run in the order they are queued); await the future for its result."""
        call = partial(fn, *args)
        if self.gate is None:
            return asyncio.get_running_loop().run_in_executor(self._executor, call)
        return asyncio.ensure_future(self._in_turn(self.gate, call))  # the gate admits one side's calls in order

    async def chain(self, step: Callable[[], tuple[T, bool]]) -> AsyncIterator[T]:
        """Call `step` on the engine's thread until it returns (value, False), yielding each value as it comes.

        Each call queues the next itself, behind whatever else was queued meanwhile, so other callers
        still take turns with it, and no step waits for the event loop: what the caller does with a
        value runs while the next step does. A caller that stops iterating (or is cancelled) drops
        the steps not yet started; one already running ends first.
        """
        if self.gate is not None:
            raise ValueError("a gated engine's calls take turns through its gate: use run()")
        loop = asyncio.get_running_loop()
        results: asyncio.Queue[tuple[T, bool] | _Failed] = asyncio.Queue()
        stopped = threading.Event()

        def deliver(result: tuple[T, bool] | _Failed) -> None:
            try:
                loop.call_soon_threadsafe(results.put_nowait, result)
            except RuntimeError:  # the event loop has closed: nobody is left to read
                stopped.set()

        def link() -> None:
            if stopped.is_set():
                return
            try:
                value, more = step()
                if more:
                    self._executor.submit(link)  # raises once the runner has closed
            except BaseException as exc:  # carried to the caller, as run() would raise it
                deliver(_Failed(exc))
                return
            deliver((value, more))

        self._executor.submit(link)
        try:
            while True:
                result = await results.get()
                if isinstance(result, _Failed):
                    raise result.error
                value, more = result
                yield value
                if not more:
                    return
        finally:
            stopped.set()

    async def _in_turn(self, gate: CoreGate, call: Callable[[], T]) -> T:
        async with gate.turn(DRAFT):
            return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        """Stop the worker thread and free the model."""
        self._executor.shutdown(wait=True)
        self.engine.close()
