"""One engine behind one worker thread: how async code calls blocking llama.cpp, one call at a time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from proxy.engine.gate import DRAFT, CoreGate
from proxy.engine.handoff import Handoff
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
        self._waiting = 0  # calls queued and not started: a chain steps aside while there are any
        self._waiting_lock = threading.Lock()
        self._handoff = Handoff()  # chained values reach the event loop from there

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking call on the engine's thread."""
        return await self.submit(fn, *args)

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue a blocking call now (calls run in the order they are queued); await the future for its result."""
        call = partial(fn, *args)
        if self.gate is None:
            return asyncio.wrap_future(self._queue(call))
        return asyncio.ensure_future(self._in_turn(self.gate, call))  # the gate admits one side's calls in order

    def _queue(self, call: Callable[[], T]) -> Future[T]:
        """Queue a call on the engine's thread, counted as waiting until it starts (or is cancelled, which only a
        call not started can be)."""
        self._count_waiting(1)

        def begin() -> T:
            self._count_waiting(-1)
            return call()

        try:
            future = self._executor.submit(begin)
        except RuntimeError:  # the runner has closed
            self._count_waiting(-1)
            raise
        future.add_done_callback(lambda done: self._count_waiting(-1) if done.cancelled() else None)
        return future

    def _count_waiting(self, change: int) -> None:
        with self._waiting_lock:
            self._waiting += change

    async def chain(self, step: Callable[[], tuple[T, bool]]) -> AsyncIterator[T]:
        """Call `step` on the engine's thread until it returns (value, False), yielding each value as it comes.

        Each step goes straight on to the next while nothing else is queued, and otherwise queues it
        behind what was, so other callers still take turns with it; no step waits for the event loop:
        what the caller does with a value runs while the next step does. A caller that stops iterating
        (or is cancelled) drops the steps not yet started; one already running ends first.
        """
        if self.gate is not None:
            raise ValueError("a gated engine's calls take turns through its gate: use run()")
        loop = asyncio.get_running_loop()
        results: asyncio.Queue[tuple[T, bool] | _Failed] = asyncio.Queue()
        stopped = threading.Event()

        def deliver(result: tuple[T, bool] | _Failed) -> None:
            if loop.is_closed():  # nobody is left to read
                stopped.set()
            else:
                self._handoff.send(loop, results.put_nowait, result)

        def link() -> None:
            while not stopped.is_set():
                try:
                    value, more = step()
                    behind = more and self._waiting > 0  # others are waiting: the next step queues behind them
                    if behind:
                        self._queue(link)
                except BaseException as exc:  # carried to the caller, as run() would raise it
                    deliver(_Failed(exc))
                    return
                deliver((value, more))
                if not more or behind:
                    return

        self._queue(link)
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
            return await asyncio.wrap_future(self._queue(call))

    def close(self) -> None:
        """Stop the worker thread and free the model."""
        self._executor.shutdown(wait=True)
        self._handoff.close()
        self.engine.close()
