"""Values from the engine's thread to event loops, through a thread of its own.

Waking an event loop writes to its self-pipe, and that write lets go of the GIL: the loop's thread
then takes it and handles the value (framing a token, writing it out) while the engine's thread waits
to start its next decode. Handed to this thread instead (a queue put, which keeps the GIL), the
wake-up happens once the engine's thread lets go of the GIL inside llama_decode, so the loop's work
runs beside the decode rather than before it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any


class Handoff:
    """One thread calling `loop.call_soon_threadsafe(fn, value)` for each value sent, in the order sent."""

    def __init__(self) -> None:
        self._queue: SimpleQueue[tuple[asyncio.AbstractEventLoop, Callable[[Any], object], Any] | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="llama-handoff", daemon=True)
        self._thread.start()

    def send(self, loop: asyncio.AbstractEventLoop, fn: Callable[[Any], object], value: Any) -> None:
        """Have `fn(value)` called on `loop` soon (dropped if the loop has closed by then)."""
        self._queue.put((loop, fn, value))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            loop, fn, value = item
            try:
                loop.call_soon_threadsafe(fn, value)
            except RuntimeError:  # the loop has closed: nobody is left to read
                pass

    def close(self) -> None:
        """Stop the thread once what was sent is handed over."""
        self._queue.put(None)
        self._thread.join()
