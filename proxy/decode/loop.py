"""The round loop: each round the request's policy decides and the loop acts, until max_tokens or the end of generation.

Glossary:
- round: the drafter proposes, the target scores, acceptance is exact (`proxy.decode.verify`); a round emits the
  accepted drafts and one token of the target's: the recovered token in place of the first rejected draft, or
  the bonus token after all of them.
- path: drafted tokens the target verifies; a lookup drafter may propose other paths with the draft
  (`Draft.alternatives`), verified together, and the round follows one.
- plain chunk: a few tokens the target decodes itself, with no draft (the policy's `Plain`, `Measure`, `Read`,
  a lookup that found nothing, or the target's first tokens while the draft reads the prompt).
- reading: the draft model reads what the target writes (`proxy.decode.reading`).
- switch: the request continues by plain chunks (one `SwitchEvent`); a greedy request's draft may read on and
  drafting resume, else speculation ends for good (`Finish`).
- probe, explore: a request on a route in passthrough that drafts again at the configured K, to re-time costs
  that may have changed (`proxy.control.route`).
- draft-ahead: the next round drafted while this one is verified (`proxy.decode.ahead`).

The loop does the I/O of a round and publishes one `RoundEvent` per round; what to do next is the
request's policy (`proxy.decode.decision`), whose decision the draft-ahead and the lookup trimming
receive too. While the draft model reads the prompt, the target decodes the first tokens plainly
instead of idling. On a fresh route the chunk that measures plain decoding comes before any reading,
which would slow it where the two share cores. It calls nothing above it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace

from proxy.config.section import MAX_K
from proxy.decode.ahead import DraftAhead, draft_ahead, resolve
from proxy.decode.decision import Action, Decision, Finish, Measure, Plain, Read, Speculate, action_for, model_k
from proxy.decode.events import PlainEvent, RoundEvent, SwitchEvent
from proxy.decode.reading import DraftReader
from proxy.decode.session import Session
from proxy.decode.verify import verify_round
from proxy.drafting.base import Draft, Drafter, DraftPlan, Source
from proxy.targets.base import Target

PLAIN_CHUNK = 8  # tokens per plain chunk after a switch
START_CHUNK = 4  # plain tokens per target call while the draft model reads the prompt
FIRST_CHUNK = 1  # the call that pays the prompt's prefill: its token goes to the client as soon as the server's would
DRAFT_ROOM = 2 * MAX_K + 1  # context the model may need past the current one: a round's drafts, a draft-ahead's
OUTGROWN = "the context outgrew the draft model's"


async def speculative_tokens(session: Session, drafter: Drafter, target: Target) -> AsyncIterator[list[int]]:
    """Yield each round's or plain chunk's tokens, as the policy decides, until max_tokens or the end of generation."""
    rounds = _Rounds(session, drafter, target)
    try:
        while (remaining := session.max_tokens - rounds.produced()) > 0:
            emitted = await rounds.act(await rounds.decide(), remaining)
            if not emitted:
                return
            yield list(emitted)
            if rounds.is_end(emitted[-1]):
                return
            rounds.context.extend(emitted)
    finally:
        await rounds.stop()


class _Rounds:
    """One generation between rounds: its context, rounds so far, the draft-ahead in flight and the draft's reading."""

    def __init__(self, session: Session, drafter: Drafter, target: Target) -> None:
        self.session, self.drafter, self.target = session, drafter, target
        self.is_end = session.is_end(drafter)
        self.context = list(session.prompt_ids)
        self.index = 0
        self.worst_tv = 0.0
        self.ahead: DraftAhead | None = None  # the next round, drafted while this one was verified
        self.reader = DraftReader(session, drafter)
        self._finish: Finish | None = None  # once set, every step is a plain chunk
        self._switched = False  # the SwitchEvent went out

    def produced(self) -> int:
        """Tokens generated so far."""
        return len(self.context) - len(self.session.prompt_ids)

    async def decide(self) -> Decision | Finish:
        """This round's decision: the policy's, within what the draft model can still hold; Finish once speculation
        ended."""
        if self._finish is not None:
            return self._finish
        decision = self.session.policy.decide()
        if not self.drafter.fits(len(self.context) + DRAFT_ROOM):
            # From then on the model neither drafts nor reads: the rest is plain or lookups (which need no context).
            self.reader.retire()
            decision = Plain(OUTGROWN) if isinstance(decision, Speculate | Read) else decision
        if isinstance(decision, Speculate):
            reason = self._over_tv()
        else:
            await self._stop_ahead()
            reason = self._over_tv() or self._stops_reading(decision)
        if reason is None:
            return decision
        self._switch(reason)
        # The reading in flight ends first: what it finds still counts, and it would slow (and mismeasure) the chunks.
        await self.reader.caught_up()
        self._finish = Finish(reason)
        return self._finish

    def _over_tv(self) -> str | None:
        """Why bounded sampling's error budget is spent, if it is."""
        return f"error bound {self.worst_tv:.3g} above max_tv" if self.worst_tv > self.session.max_tv else None

    def _stops_reading(self, decision: Measure | Read | Plain) -> str | None:
        """Why speculation ends for good: a model draft that drafts nothing ends it unless it keeps reading what the
        target writes (which tells the policy when drafting would pay again); a lookup drafter goes on, in plain
        chunks where nothing is worth verifying. Plain decoding is exact and always allowed."""
        reads_on = self.reader.reads_on()
        if isinstance(decision, Measure) or self.drafter.looks_up or reads_on:
            return None
        return decision.reason

    def _switch(self, reason: str) -> None:
        """Say once that the request continues by plain decoding."""
        if not self._switched:
            self._switched = True
            self.session.publish(SwitchEvent(self.session.request_id, self.session.route, reason))

    def _first_chunk(self) -> int | None:
        """FIRST_CHUNK where the next plain call pays the prompt's prefill (and so measures nothing), else None."""
        return FIRST_CHUNK if self.session.at_prompt(self.context) else None

    async def act(self, decision: Decision | Finish, remaining: int) -> tuple[int, ...]:
        """The next tokens, up to the end of generation, as the decision says."""
        if not isinstance(decision, Measure | Finish):  # the draft's reading would slow the chunk that measures
            self.reader.start(self.context)
        reading_prompt = self.reader.reading_prompt()
        action = action_for(decision, looks_up=self.drafter.looks_up, reading_prompt=reading_prompt)
        if action is Action.ROUND:
            assert not isinstance(decision, Finish | Measure)
            return await self._round(decision, remaining, reading_prompt)
        if isinstance(decision, Plain):  # a model drafter reads along (else speculation ended)
            self._switch(decision.reason)
        opening = START_CHUNK if reading_prompt else PLAIN_CHUNK
        n = PLAIN_CHUNK if isinstance(decision, Finish) else self._first_chunk() or opening
        return await self._plain(min(n, remaining), read=action is Action.PLAIN_READ)

    async def _plain(self, n: int, *, read: bool, lookup_missed: bool = False, declined: tuple[int, ...] = (),
                     match: int = 0) -> tuple[int, ...]:
        """A chunk of up to n tokens decoded by the target, up to the end of generation; the draft reads it if asked."""
        session, started, draft_busy = self.session, time.perf_counter(), self.reader.busy()
        decoded = await self.target.generate(self.context, n, session.params, session.target_seed(),
                                             session.client_headers, model=session.model)
        session.publish(PlainEvent(session.request_id, session.route, tuple(decoded), time.perf_counter() - started,
                                   lookup_missed, declined, match, prefill=session.at_prompt(self.context),
                                   draft_busy=draft_busy))
        tokens = _until_end(decoded, self.is_end)
        if read:
            self.reader.read(self.context, tokens)
        return tokens

    async def _round(self, decision: Speculate | Read | Plain, remaining: int, reading_prompt: bool) -> tuple[int, ...]:
        """A round (lookup paths only unless the model speculates); a plain chunk where nothing was drafted."""
        # A round emits up to k + 1 tokens; the last round still drafts one so every token goes
        # through the sampler. Cutting a round's output short keeps it exact (each prefix follows
        # the target's distribution).
        cap = max(remaining - 1, 1)
        plan = self.session.draft_plan(min(model_k(decision), cap), cap, decision)
        started = time.perf_counter()  # the target waits from here: for the model's reading, then for its draft
        if reading_prompt:
            plan = replace(plan, k=0)  # lookups only until the model has read the prompt
        elif plan.k > 0:
            # The model may draft: after what it is still reading (the last plain chunk, read while the target
            # decoded it or just after). A lookup-only round goes on meanwhile, rather than leave the target idle.
            await self.reader.caught_up()
        ahead, plan, draft = await self._draft(plan)
        if not draft.tokens:
            # While the model drafts nothing, a sampled request's model learns nothing from reading the chunk
            # (a later draft reads what it missed), and where it shares the target's cores it slows the target.
            n = self._first_chunk() or self.session.policy.plain_chunk()
            return await self._plain(min(n, remaining), read=isinstance(decision, Speculate) or self.reader.resumes,
                                     lookup_missed=True, declined=draft.declined, match=draft.match)
        return await self._verified(decision, plan, draft, ahead, remaining, started)

    async def _draft(self, plan: DraftPlan) -> tuple[DraftAhead | None, DraftPlan, Draft]:
        """The round's draft and plan: those drafted ahead during the last round after a hit, else fresh ones."""
        ahead, self.ahead = self.ahead, None  # kept only after a hit
        if ahead is not None and (draft := await ahead.draft()) is not None:
            return ahead, ahead.plan, draft
        return None, plan, await self.drafter.propose(self.context, plan)

    async def _verified(self, decision: Decision, plan: DraftPlan, draft: Draft, ahead: DraftAhead | None,
                        remaining: int, started: float) -> tuple[int, ...]:
        """Verify the draft (drafting the next round ahead meanwhile), publish the round, and return what it emits."""
        session, drafted_at = self.session, time.perf_counter()
        verification = asyncio.ensure_future(verify_round(session, self.target, self.context, draft))
        try:  # from its start: whatever ends the round early (a client gone, a failed draft-ahead) stops it too
            self.ahead = draft_ahead(session, self.drafter, self.context, draft, remaining, decision)
            verdict = await verification
        finally:
            verification.cancel()
        hit = None
        if self.ahead is not None:
            hit = await resolve(self.ahead, draft, verdict.accepted, verdict.emitted, self.is_end)
            self.ahead = self.ahead if hit else None
        emitted = _until_end(verdict.emitted[:remaining], self.is_end)
        self.worst_tv = max(self.worst_tv, verdict.tv_bound)
        asked = plan.k if draft.source == Source.MODEL else plan.lookup_k
        session.publish(RoundEvent(
            request_id=session.request_id, route=session.route, index=self.index, k=asked, drafted=verdict.followed,
            accepted=verdict.accepted, emitted=emitted, draft_seconds=drafted_at - started,
            verify_seconds=time.perf_counter() - drafted_at, tv_bound=verdict.tv_bound, source=draft.source,
            candidates=1 + len(draft.alternatives), declined=draft.declined, led=draft.led, checked=draft.checked,
            beyond=draft.beyond if verdict.followed == draft.tokens else None, match=draft.match,
            drafted_ahead=ahead is not None,
            drafting_seconds_per_token=ahead.seconds_per_token if ahead else draft.seconds_per_token,
            ahead_hit=hit, context=len(self.context), prefill=session.at_prompt(self.context)))
        self.index += 1
        return emitted

    async def _stop_ahead(self) -> None:
        """Drop the draft-ahead in flight, if any."""
        if self.ahead is not None:
            await self.ahead.cancel()
            self.ahead = None

    async def stop(self) -> None:
        """Drop the draft-ahead and the reading in flight, if any."""
        await self._stop_ahead()
        await self.reader.stop()


def _until_end(tokens: Sequence[int], is_end: Callable[[int], bool]) -> tuple[int, ...]:
    """The tokens up to and including the first end of generation (a draft may run past it)."""
    for position, token in enumerate(tokens):
        if is_end(token):
            return tuple(tokens[: position + 1])
    return tuple(tokens)
