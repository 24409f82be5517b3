"""Reading along: the draft model reads what the target writes, while the target goes on.

The draft model reads the prompt while the target decodes the first tokens plainly (the prompt's
prefill is then hidden on both sides), then each plain chunk the target decodes, one reading after
another (a chain: one evaluation at a time per sequence). A greedy request's reading says what the
draft would have drafted before each token (a `ReadEvent`), which tells its policy when drafting
would pay again; after a switch, a greedy request's draft reads on until the policy finds that it
cannot pay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TypeVar

import structlog

from proxy.decode.events import ReadEvent
from proxy.decode.session import Session
from proxy.drafting.base import Drafter

log = structlog.get_logger("speculoos.reading")
T = TypeVar("T")


class DraftReader:
    """One request's reading along: its chain of readings in flight, and whether the draft reads at all."""

    def __init__(self, session: Session, drafter: Drafter) -> None:
        self._session, self._drafter = session, drafter
        self._reads = session.warm_up  # the draft model reads what the target writes
        # After a switch a greedy request's draft reads on: what it would have drafted tells when drafting pays again.
        self._resumes = session.warm_up and session.params.greedy and session.policy.model_may_pay()
        self._prompt: asyncio.Future[None] | None = None  # the chain's first reading: the prompt
        self._last: asyncio.Future[None] | None = None  # the chain's last reading
        self._started = False  # the prompt's reading was considered (it starts once, if ever)

    @property
    def resumes(self) -> bool:
        """Whether the draft reads on after a decision not to draft."""
        return self._resumes

    def reads_on(self) -> bool:
        """After a decision not to draft: whether the draft reads on; once its model cannot pay, it stops for good."""
        self._resumes = self._resumes and self._session.policy.model_may_pay()
        return self._resumes

    def retire(self) -> None:
        """Stop reading for good (the context outgrew the draft model's)."""
        self._reads = self._resumes = False

    def start(self, context: Sequence[int]) -> None:
        """Have the draft model read the prompt in the background, once, when the request warms up that way and the
        model may draft for it."""
        if self._started:
            return
        self._started = True
        if (self._reads and self._session.policy.model_may_pay()
                and (pending := self._drafter.prefill(self._session.request_id, list(context)))):
            self._last = self._prompt = asyncio.ensure_future(_quietly(pending, "reading the prompt"))

    def read(self, context: Sequence[int], tokens: tuple[int, ...]) -> None:
        """Have the draft model read a plain chunk once it has read everything before it (if it reads at all)."""
        if not (self._reads and tokens):
            return
        previous, context = self._last, list(context)

        async def read() -> None:
            if previous is not None:
                await previous  # never fails; cancelling this reading cancels it too
            predicted = await _quietly(self._predict(context, tokens), "reading a plain chunk")
            session = self._session
            if predicted is not None and session.params.greedy:  # a sampled draft's argmax is not its draft
                session.publish(ReadEvent(session.request_id, session.route, tokens, tuple(predicted)))

        self._last = asyncio.ensure_future(read())

    async def _predict(self, context: list[int], tokens: tuple[int, ...]) -> list[int] | None:
        """The draft reads tokens after context: its greedy choice at each (None: the drafter has no model)."""
        pending = self._drafter.read(self._session.request_id, context, tokens)
        return None if pending is None else await pending

    def reading_prompt(self) -> bool:
        """Whether the draft model is still reading the prompt."""
        return self._prompt is not None and not self._prompt.done()

    def busy(self) -> bool:
        """Whether a reading is in flight."""
        return self._last is not None and not self._last.done()

    async def caught_up(self) -> None:
        """Wait until the draft model has read everything the target wrote."""
        if self._last is not None:
            await self._last

    async def stop(self) -> None:
        """Drop the reading in flight, if any."""
        if self._last is not None:
            self._last.cancel()
            await asyncio.wait({self._last})
            self._last = None


async def _quietly(pending: Awaitable[T], what: str) -> T | None:
    """A reading's result, or None after logging its failure: reading ahead saves time, the next draft reads itself."""
    try:
        return await pending
    except Exception:
        log.warning(f"{what} failed; the next draft reads it itself", exc_info=True)
        return None
