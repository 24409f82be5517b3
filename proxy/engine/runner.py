"""One engine behind one worker thread and one lock: how async code calls blocking llama.cpp."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from proxy.engine.llama import LlamaEngine

T = TypeVar("T")


class EngineRunner:
    """Serializes access to one engine and runs its blocking calls on one worker thread."""

    def __init__(self, engine: LlamaEngine) -> None:
        self.engine = engine
        self.lock = asyncio.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking call on the engine's thread (the caller holds `lock` when state matters)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    def close(self) -> None:
        """Stop the worker thread and free the model."""
        self._executor.shutdown(wait=True)
        self.engine.close()
