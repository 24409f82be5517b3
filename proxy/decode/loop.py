"""The round loop: propose -> score -> accept -> publish, until max_tokens or the end of generation.

The loop does the I/O of a round and publishes one `RoundEvent` per round; the acceptance maths
is `proxy.sampling` (pure functions of the distributions), and what K to draft next is the
request's policy. When the drafter finds nothing worth verifying, the target decodes a chunk
plainly instead of verifying an empty draft, and the loop looks again. While a round is being
verified, the next one is drafted ahead when the request pipelines (`proxy.decode.ahead`). While
the draft model reads the prompt, the target decodes the first tokens plainly instead of idling
(the two work at the same time; the prompt's prefill is then hidden on both sides). On a fresh
route the chunk that measures plain decoding comes before any reading, which would slow it where
the two share cores. It calls nothing above it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

import structlog

from proxy.config.schema import MAX_K
from proxy.control.policy import Decision
from proxy.decode.ahead import DraftAhead
from proxy.decode.events import ReadEvent, RoundEvent, SwitchEvent
from proxy.decode.plain import PLAIN_CHUNK, plain_chunk, plain_tokens
from proxy.decode.session import Session
from proxy.drafting.base import Draft, Drafter
from proxy.sampling.candidates import verify_candidates
from proxy.sampling.processors import one_hot
from proxy.sampling.rejection import verify_on_support
from proxy.targets.base import Target

log = structlog.get_logger("speculoos.loop")
T = TypeVar("T")
START_CHUNK = 4  # plain tokens per target call while the draft model reads the prompt
FIRST_CHUNK = 1  # the call that pays the prompt's prefill: its token goes to the client as soon as the server's would
DRAFT_ROOM = 2 * MAX_K + 1  # context the model may need past the current one: a round's drafts, a draft-ahead's
OUTGROWN = "the context outgrew the draft model's"


async def speculative_tokens(session: Session, drafter: Drafter, target: Target) -> AsyncIterator[list[int]]:
    """Yield each round's emitted tokens; continue by plain decoding when the policy says K = 0."""
    rounds = _Rounds(session, drafter, target)
    is_end = session.is_end(drafter)
    produced = 0
    try:
        while produced < session.max_tokens:
            remaining = session.max_tokens - produced
            decision = rounds.within_draft_context(session.policy.next_k())
            if decision.k == 0:
                await rounds.stop_ahead()
                rounds.resumes = rounds.resumes and session.policy.model_may_pay()
            # K = 0 ends speculation for a model draft unless it keeps reading what the target writes
            # (which tells the policy when drafting would pay again); a lookup drafter goes on, in
            # plain chunks where nothing is worth verifying. Plain decoding is exact and always allowed.
            if rounds.over_tv() or (decision.k == 0 and not decision.measure_plain and not drafter.looks_up
                                    and not rounds.resumes):
                reason = decision.reason if decision.k == 0 else f"error bound {rounds.worst_tv:.3g} above max_tv"
                if not rounds.switched:
                    session.publish(SwitchEvent(session.request_id, session.route, reason))
                # The reading in flight ends first: what it finds still counts, and it would slow (and so
                # mismeasure) the plain chunks.
                await rounds.caught_up()
                async for tokens in plain_tokens(session, target, rounds.context, remaining):
                    yield tokens
                return
            if not decision.measure_plain:  # the draft's reading would slow the chunk that measures plain decoding
                rounds.start_reading()
            emitted = await rounds.step(decision, remaining)
            if not emitted:
                return
            produced += len(emitted)
            yield list(emitted)
            if is_end(emitted[-1]):
                return
            rounds.context.extend(emitted)
    finally:
        await rounds.stop_drafting()


class _Rounds:
    """One generation's state between rounds: its context, rounds so far, and the draft-ahead in flight."""

    def __init__(self, session: Session, drafter: Drafter, target: Target) -> None:
        self.session, self.drafter, self.target = session, drafter, target
        self.context = list(session.prompt_ids)
        self.index = 0
        self.worst_tv = 0.0
        self.ahead: DraftAhead | None = None  # the next round, drafted while this one was verified
        self.reads = session.warm_up  # the draft model reads what the target writes while the target goes on
        # After a switch a greedy request's draft reads on: what it would have drafted tells when drafting pays again,
        # until the policy finds that it cannot.
        self.resumes = session.warm_up and session.params.greedy and session.policy.model_may_pay()
        self.reading: asyncio.Future[None] | None = None  # the draft model's reading in flight (the last of a chain)
        self.reading_prompt: asyncio.Future[None] | None = None  # the chain's first: the prompt
        self.started_reading = False
        self.switched = False  # a SwitchEvent was published
        self.outgrown = False  # the context no longer fits the draft model's

    def within_draft_context(self, decision: Decision) -> Decision:
        """The decision, or K = 0 once the context outgrew the draft model's: from then on the model neither drafts
        nor reads, and the rest is decoded plainly or drafted by lookups (which need no context)."""
        if not self.outgrown and not self.drafter.fits(len(self.context) + DRAFT_ROOM):
            self.outgrown, self.reads, self.resumes = True, False, False
        return Decision(0, OUTGROWN) if self.outgrown and (decision.k > 0 or decision.reading) else decision

    def _first_chunk(self) -> int | None:
        """FIRST_CHUNK where the next plain call pays the prompt's prefill (and so measures nothing), else None."""
        return FIRST_CHUNK if self.session.at_prompt(self.context) else None

    def over_tv(self) -> bool:
        """Whether bounded sampling's error budget is spent."""
        return self.worst_tv > self.session.max_tv

    def start_reading(self) -> None:
        """Have the draft model read the prompt in the background, once, when the request warms up that way and the
        model may draft for it."""
        if self.started_reading:
            return
        self.started_reading = True
        if (self.reads and self.session.policy.model_may_pay()
                and (pending := self.drafter.prefill(self.session.request_id, list(self.context)))):
            self.reading = self.reading_prompt = asyncio.ensure_future(_quietly(pending, "reading the prompt"))

    def _read(self, tokens: tuple[int, ...]) -> None:
        """Have the draft model read a plain chunk once it has read everything before it."""
        previous, context = self.reading, list(self.context)

        async def read() -> None:
            if previous is not None:
                await previous  # never fails; cancelling this reading cancels it too
            predicted = await _quietly(self._predict(context, tokens), "reading a plain chunk")
            if predicted is not None and self.session.params.greedy:  # a sampled draft's argmax is not its draft
                self.session.publish(ReadEvent(self.session.request_id, self.session.route, tokens, tuple(predicted)))

        self.reading = asyncio.ensure_future(read())

    async def _predict(self, context: list[int], tokens: tuple[int, ...]) -> list[int] | None:
        """The draft reads tokens after context: its greedy choice at each (None: the drafter has no model)."""
        pending = self.drafter.read(self.session.request_id, context, tokens)
        return None if pending is None else await pending

    def prompt_read(self) -> bool:
        """Whether the draft model has read the prompt (or never had to)."""
        return self.reading_prompt is None or self.reading_prompt.done()

    async def caught_up(self) -> None:
        """Wait until the draft model has read everything the target wrote (one evaluation at a time per sequence)."""
        if self.reading is not None:
            await self.reading

    async def stop_ahead(self) -> None:
        """Drop the draft-ahead in flight, if any."""
        if self.ahead is not None:
            await self.ahead.cancel()
            self.ahead = None

    async def stop_drafting(self) -> None:
        """Drop the draft-ahead and the reading in flight, if any."""
        await self.stop_ahead()
        if self.reading is not None:
            self.reading.cancel()
            await asyncio.wait({self.reading})
            self.reading = None

    async def step(self, decision: Decision, remaining: int) -> tuple[int, ...]:
        """The next tokens, up to the end of generation: a plain chunk to measure the plain rate, a plain chunk
        after a lookup miss, or a round."""
        session, is_end = self.session, self.session.is_end(self.drafter)
        reading_prompt = not self.prompt_read()
        if decision.k == 0 and (decision.measure_plain or not self.drafter.looks_up):
            self._switch(decision)
            n = self._first_chunk() or (START_CHUNK if reading_prompt else PLAIN_CHUNK)
            return await self._plain(min(n, remaining), read=not decision.measure_plain)
        if reading_prompt and not self.drafter.looks_up:  # the target goes on while the draft reads the prompt
            return await self._plain(min(self._first_chunk() or START_CHUNK, remaining))
        # A round emits up to k + 1 tokens; the last round still drafts one so every token goes
        # through the sampler. Cutting a round's output short keeps it exact (each prefix follows
        # the target's distribution).
        cap = max(remaining - 1, 1)
        plan = session.draft_plan(min(decision.k, cap), cap)
        started = time.perf_counter()  # the target waits from here: for the model's reading, then for its draft
        if reading_prompt:
            plan = replace(plan, k=0)  # lookups only until the model has read the prompt
        elif plan.k > 0:
            # The model may draft: after what it is still reading (the last plain chunk, read while the target
            # decoded it or just after). A lookup-only round goes on meanwhile, rather than leave the target idle.
            await self.caught_up()
        ahead, self.ahead = self.ahead, None  # kept only after a hit
        draft = await ahead.draft() if ahead is not None else None
        if draft is not None:
            plan = ahead.plan
        else:
            ahead, draft = None, await self.drafter.propose(self.context, plan)
        if not draft.tokens:
            # While the model drafts nothing, a sampled request's model learns nothing from reading the chunk
            # (a later draft reads what it missed), and where it shares the target's cores it slows the target.
            return await self._plain(min(self._first_chunk() or session.policy.plain_chunk(), remaining),
                                     lookup_missed=True,
                                     declined=draft.declined, read=decision.k > 0 or self.resumes)
        drafted_at = time.perf_counter()
        verification = asyncio.ensure_future(_verify(session, self.target, self.context, draft))
        self.ahead = _draft_ahead(session, self.drafter, self.context, draft, remaining)
        try:
            emitted, accepted, followed, tv_bound = await verification
        finally:
            verification.cancel()  # a client gone while waiting stops the verification too
        emitted = _until_end(emitted[:remaining], is_end)
        hit = None
        if self.ahead is not None:
            hit = await _resolve(self.ahead, draft, accepted, emitted, is_end)
            self.ahead = self.ahead if hit else None
        self.worst_tv = max(self.worst_tv, tv_bound)
        asked = plan.k if draft.source == "model" else plan.lookup_k
        session.publish(RoundEvent(
            session.request_id, session.route, self.index, asked, followed, accepted, emitted, drafted_at - started,
            time.perf_counter() - drafted_at, tv_bound, draft.source, 1 + len(draft.alternatives), draft.declined,
            drafted_ahead=ahead is not None,
            drafting_seconds_per_token=ahead.seconds_per_token if ahead else draft.seconds_per_token,
            ahead_hit=hit, context=len(self.context), prefill=session.at_prompt(self.context)))
        self.index += 1
        return emitted

    def _switch(self, decision: Decision) -> None:
        """Say once that the request continues by plain decoding (the draft reading along)."""
        if not (decision.measure_plain or decision.reading or self.switched):
            self.switched = True
            self.session.publish(SwitchEvent(self.session.request_id, self.session.route, decision.reason))

    async def _plain(self, n: int, *, lookup_missed: bool = False, declined: tuple[int, ...] = (),
                     read: bool = True) -> tuple[int, ...]:
        """A chunk of up to n tokens decoded by the target, up to the end of generation; the draft reads it if asked."""
        busy = self.reading is not None and not self.reading.done()
        tokens = await plain_chunk(self.session, self.target, self.context, n, lookup_missed=lookup_missed,
                                   declined=declined, draft_busy=busy)
        tokens = _until_end(tuple(tokens), self.session.is_end(self.drafter))
        if self.reads and read and tokens:
            self._read(tokens)
        return tokens


async def _quietly(pending: Awaitable[T], what: str) -> T | None:
    """A reading's result, or None after logging its failure: reading ahead saves time, the next draft reads itself."""
    try:
        return await pending
    except Exception:
        log.warning(f"{what} failed; the next draft reads it itself", exc_info=True)
        return None


async def _resolve(ahead: DraftAhead, draft: Draft, accepted: int, emitted: tuple[int, ...],
                   is_end: Callable[[int], bool]) -> bool:
    """Whether the pre-draft continues what the round emitted (a hit); a miss is stopped."""
    if accepted == len(draft) and len(emitted) == len(draft) + 1 and not is_end(emitted[-1]):
        return await ahead.guessed(emitted[-1])
    await ahead.cancel()  # a draft was rejected: what follows the all-accepted branch is moot
    return False


def _draft_ahead(session: Session, drafter: Drafter, context: list[int], draft: Draft,
                 remaining: int) -> DraftAhead | None:
    """Start drafting the next round from the all-accepted branch, when the request pipelines and one may follow."""
    after = remaining - len(draft) - 1  # tokens still to emit if this round accepts everything
    if (not session.pipeline or draft.source != "model" or draft.alternatives or after <= 0
            or session.is_end(drafter)(draft.tokens[-1])):
        return None
    k = session.policy.next_k().k
    if k == 0:
        return None
    cap = max(after - 1, 1)
    return DraftAhead(drafter, [*context, *draft.tokens], session.draft_plan(1, 1),
                      session.draft_plan(min(k, cap), cap))


async def _verify(session: Session, target: Target, context: list[int],
                  draft: Draft) -> tuple[tuple[int, ...], int, tuple[int, ...], float]:
    """Score the draft (and its alternative paths) and accept exactly: (emitted, accepted, path followed, tv bound)."""
    if not draft.alternatives:
        scores = await target.score(context, draft, session.score_plan())
        result = verify_on_support(draft.tokens, scores.support, session.random.accept)
        return result.emitted, result.accepted, draft.tokens, scores.tv_bound
    paths = (draft.tokens, *draft.alternatives)
    vocab = draft.probs.shape[1]
    candidates = [draft, *(Draft(path, one_hot(path, vocab), draft.source) for path in draft.alternatives)]
    plans = [session.score_plan() for _ in paths]  # drawn in order, so a seeded request's seeds do not depend on timing
    scored = await asyncio.gather(*(target.score(context, c, plan) for c, plan in zip(candidates, plans, strict=True)))
    tree = verify_candidates(paths, [s.support for s in scored], session.random.accept)
    return tree.emitted, tree.accepted, paths[tree.candidate], max(s.tv_bound for s in scored)


def _until_end(tokens: tuple[int, ...], is_end: Callable[[int], bool]) -> tuple[int, ...]:
    """The tokens up to and including the first end of generation (a draft may run past it)."""
    for position, token in enumerate(tokens):
        if is_end(token):
            return tokens[: position + 1]
    return tokens
