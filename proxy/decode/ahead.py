"""Draft-ahead: draft the next round while this one is being verified, as if every draft will be accepted.

While the target verifies d_1..d_K, the drafter goes on from the all-accepted continuation: it guesses
the target's own next token g, then drafts the next round after context + d_1..d_K + g. If the
target accepts all K drafts and its next token is g (a hit), those tokens are the next round's
draft and the round trip is hidden behind the drafting; otherwise they are dropped. Exactness
holds: the pre-drafted tokens are an ordinary draft sample for the prefix they follow, drawn from
a stream of their own, and whether they are used depends only on g and the target's draws.

The model drafter drafts ahead in the request's own sequence: its cache already holds the
all-accepted continuation, and on a miss the next draft keeps only the prefix that was accepted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import structlog

from proxy.decode.decision import Decision, model_k
from proxy.decode.session import Session
from proxy.drafting.base import Draft, Drafter, DraftPlan, Source

log = structlog.get_logger("speculoos.ahead")


class DraftAhead:
    """One pre-draft in flight: the guessed next token, then the next round's draft after it."""

    def __init__(self, drafter: Drafter, continuation: Sequence[int], guess_plan: DraftPlan,
                 next_plan: DraftPlan) -> None:
        self._drafter, self._continuation, self.plan = drafter, list(continuation), next_plan
        self.seconds_per_token: float | None = None  # the pre-draft's own drafting speed, once it is done
        self._guess = asyncio.ensure_future(drafter.propose(self._continuation, guess_plan))
        self._next = asyncio.ensure_future(self._draft_next())

    async def _draft_next(self) -> Draft | None:
        started = time.perf_counter()
        guess = await self._guess
        if not guess.tokens:
            return None
        draft = await self._drafter.propose([*self._continuation, guess.tokens[0]], self.plan)
        self.seconds_per_token = (time.perf_counter() - started) / (1 + len(draft))
        return draft

    async def guessed(self, target_token: int) -> bool:
        """Whether the guess is the target's token after the accepted drafts; the pre-draft stops if not."""
        try:
            guess = await self._guess
        except Exception:  # a failed pre-draft is only a miss: the next round drafts in the open
            log.warning("draft-ahead failed", exc_info=True)
            guess = None
        if guess is not None and guess.tokens and guess.tokens[0] == target_token:
            return True
        await self.cancel()
        return False

    async def draft(self) -> Draft | None:
        """The next round's draft, after a hit (None if drafting it failed)."""
        try:
            return await self._next
        except Exception:
            log.warning("draft-ahead failed", exc_info=True)
            return None

    async def cancel(self) -> None:
        """Stop drafting ahead and wait until the drafter has let go of the request's sequence."""
        tasks = (self._next, self._guess)
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)  # unlike awaiting each, lets a cancellation of the caller through
        for task in tasks:
            if not task.cancelled():
                task.exception()  # retrieved: a failure while stopping is not worth a warning


async def resolve(ahead: DraftAhead, draft: Draft, accepted: int, emitted: tuple[int, ...],
                  is_end: Callable[[int], bool]) -> bool:
    """Whether the pre-draft continues what the round's verification emitted (a hit: every draft accepted, no end of
    generation among them, and the guess is the target's next token); a miss is stopped."""
    if accepted == len(draft) and len(emitted) == len(draft) + 1 and not any(map(is_end, emitted)):
        return await ahead.guessed(emitted[-1])
    await ahead.cancel()  # a draft was rejected: what follows the all-accepted continuation is moot
    return False


def draft_ahead(session: Session, drafter: Drafter, context: list[int], draft: Draft, remaining: int,
                decision: Decision) -> DraftAhead | None:
    """Start drafting the next round from the all-accepted continuation, at the round's K, when the request
    pipelines and one may follow."""
    after = remaining - len(draft) - 1  # tokens still to emit if this round accepts everything
    k = model_k(decision)
    if (not session.pipeline or draft.source != Source.MODEL or draft.alternatives or after <= 0
            or session.is_end(drafter)(draft.tokens[-1]) or k == 0):
        return None
    cap = max(after - 1, 1)
    return DraftAhead(drafter, [*context, *draft.tokens], session.draft_plan(1, 1, decision),
                      session.draft_plan(min(k, cap), cap, decision))
