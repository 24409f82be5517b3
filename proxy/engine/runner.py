"""One engine behind one worker thread: how async code calls blocking llama.cpp, one call at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from proxy.engine.gate import DRAFT, CoreGate
from proxy.engine.llama import LlamaEngine

T = TypeVar("T")


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

    async def _in_turn(self, gate: CoreGate, call: Callable[[], T]) -> T:
        async with gate.turn(DRAFT):
            return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        """Stop the worker thread and free the model."""
        self._executor.shutdown(wait=True)
        self.engine.close()
