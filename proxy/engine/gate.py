"""Turns on shared cores: a draft model and its target on one machine never compute at the same time.

llama.cpp's threads meet at a barrier after every operation; when a draft model and its target
compute at once on the same cores, each barrier waits for a thread the other model holds (a
verification of 5 tokens took 2.3 s against 40 ms a plain step on two cores). Splitting the cores
avoids that but leaves the target slower for good, also while the draft sits idle. A `CoreGate`
lets each model use every core in turn instead: the draft's engine calls and the proxy's calls
to its target take turns, many of one side at once (the target batches them; the draft runs
one call at a time anyway), never both sides. A side that waits is served before newcomers of the
side that holds the gate, so neither starves. Requests to the target that pass through untouched
do not take turns: the gate times the proxy's own work only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

Side = Literal["draft", "target"]
DRAFT: Side = "draft"
TARGET: Side = "target"


class CoreGate:
    """One machine's cores, held by the draft or by the target (by many calls of that side at once)."""

    def __init__(self) -> None:
        self.holder: Side | None = None
        self.holding = 0  # calls of the holder's side inside
        self.turns = 0  # hand-overs from one side to the other, for status and tests
        self._last: Side | None = None  # the side that held the cores last
        self._waiting: deque[tuple[Side, asyncio.Future[None]]] = deque()

    @asynccontextmanager
    async def turn(self, side: Side) -> AsyncIterator[None]:
        """Hold the cores for one call of `side`, waiting while the other side holds them."""
        await self._enter(side)
        try:
            yield
        finally:
            self._leave()

    async def _enter(self, side: Side) -> None:
        if not self._waiting and self.holder in (None, side):
            self._admit(side)
            return
        entry = (side, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].done() and not entry[1].cancelled():
                self._leave()  # admitted just before the cancellation: hand the turn on
            else:
                self._waiting.remove(entry)
                self._wake()  # the queue's head may have changed
            raise

    def _admit(self, side: Side) -> None:
        if self.holder not in (None, side):
            raise AssertionError(f"the gate is held by the {self.holder}")
        if self._last not in (None, side):
            self.turns += 1
        self.holder, self._last = side, side
        self.holding += 1

    def _leave(self) -> None:
        self.holding -= 1
        if self.holding == 0:
            self.holder = None
            self._wake()

    def _wake(self) -> None:
        """Admit the waiting calls at the head of the queue that are of one side, in their order."""
        if not self._waiting:
            return
        side = self._waiting[0][0]
        if self.holder not in (None, side):
            return
        while self._waiting and self._waiting[0][0] == side:
            _, future = self._waiting.popleft()
            if not future.done():
                self._admit(side)
                future.set_result(None)
