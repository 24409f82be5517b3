"""Draft-ahead in the round loop: hits use the pre-drafted tokens, misses drop them, a client gone stops everything.

Exactness is checked as for a single round: greedy identity, seeded reproduction, and a seeded
chi-square of the tokens emitted after pre-drafted rounds, with a negative control.
"""

from __future__ import annotations

import asyncio

import pytest

from proxy.drafting.base import Draft, DraftPlan
from proxy.sampling.processors import SamplingParams
from tests.fakes.drafter import ScriptedDrafter, ToyDrafter
from tests.fakes.toy_model import ToyModel
from tests.unit.decode.harness import PROMPT, Served, follow, rounds, run

GUESS = 1  # the drafter is asked for one token: its guess of the target's own next token


def near_draft(target: ToyModel) -> ToyDrafter:
    """A sampling draft close to the target: often right, but it favours token 2 in every context.

    The bias is the same everywhere, so a draft's distribution leaking into the output shows in
    each position's marginal distribution instead of averaging out over contexts.
    """
    model = ToyModel(seed=target.seed)
    model.table[:, :, 2] += 3.0
    return ToyDrafter(model)


async def test_a_hit_verifies_the_pre_drafted_tokens_without_drafting_again(served: Served) -> None:
    drafter = follow(served.model)
    batches, events = await run(served, drafter, 15, k=4, pipeline=True)
    assert sum(batches, []) == served.model.greedy(PROMPT, 15)
    assert [(e.drafted_ahead, e.ahead_hit) for e in rounds(events)] == [(False, True), (True, True), (True, None)]
    # Round 0 drafts after the prompt; each pre-draft guesses the token after a round's 4 drafts, then
    # drafts 4 more after it; the last round has no room for another.
    assert drafter.calls == [(4, 4), (8, GUESS), (9, 4), (13, GUESS), (14, 4)]


async def test_a_wrong_guess_drops_the_pre_drafted_tokens(served: Served) -> None:
    model = served.model

    def script(context, k):
        tokens = model.greedy(context, k)
        return [(tokens[0] + 1) % model.vocab or 1] if k == GUESS else tokens

    drafter = ScriptedDrafter(script)
    batches, events = await run(served, drafter, 15, k=4, pipeline=True)
    assert sum(batches, []) == model.greedy(PROMPT, 15)
    assert not any(e.drafted_ahead for e in rounds(events))
    assert all(e.accepted == 4 for e in rounds(events))  # every draft right, the guess wrong: a miss all the same
    assert [e.ahead_hit for e in rounds(events)] == [False, False, None]


class BlockingAhead(ScriptedDrafter):
    """Follows the target; a guess (a pre-draft) never finishes, and a cancelled one is counted."""

    def __init__(self, model: ToyModel, wrong_at: int | None = None) -> None:
        super().__init__(follow(model, wrong_at).script)
        self.started = asyncio.Event()
        self.cancelled = 0

    async def propose(self, context, plan: DraftPlan) -> Draft:
        if plan.k != GUESS:
            return await super().propose(context, plan)
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise AssertionError("unreachable")


async def test_a_rejected_draft_cancels_the_pre_draft_at_once(served: Served) -> None:
    drafter = BlockingAhead(served.model, wrong_at=2)
    batches, events = await asyncio.wait_for(run(served, drafter, 12, k=4, pipeline=True), 5)
    assert sum(batches, []) == served.model.greedy(PROMPT, 12)
    started = sum(e.ahead_hit is not None for e in rounds(events))
    assert started >= 3 and drafter.cancelled == started and not any(e.ahead_hit for e in rounds(events))


class BlockingTarget:
    """The served target, except that verifications never answer; a cancelled one is counted."""

    def __init__(self, served: Served) -> None:
        self._served = served
        self.order = served.target.order
        self.cancelled = 0

    async def score(self, context, draft, plan):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    def __getattr__(self, name):
        return getattr(self._served.target, name)


async def test_a_client_gone_during_a_pre_draft_stops_the_draft_and_the_verification(served: Served) -> None:
    drafter, target = BlockingAhead(served.model), BlockingTarget(served)
    generation = asyncio.ensure_future(run(served, drafter, 20, k=4, pipeline=True, target=target))
    await asyncio.wait_for(drafter.started.wait(), 5)
    generation.cancel()  # what the server does to a handler whose client hung up
    with pytest.raises(asyncio.CancelledError):
        await generation
    assert (drafter.cancelled, target.cancelled) == (1, 1)


async def test_a_seeded_pipelined_request_reproduces(served: Served) -> None:
    params = SamplingParams(temperature=1.0, top_k=5)
    drafter = near_draft(served.model)
    first, events = await run(served, drafter, 24, k=1, params=params, seed=42, pipeline=True)
    again, _ = await run(served, drafter, 24, k=1, params=params, seed=42, pipeline=True)
    other, _ = await run(served, drafter, 24, k=1, params=params, seed=43, pipeline=True)
    assert sum(first, []) == sum(again, []) != sum(other, [])
    assert any(e.drafted_ahead for e in rounds(events))
