"""The round loop: propose -> score -> accept -> publish, until max_tokens or the end of generation.

The loop does the I/O of a round and publishes one `RoundEvent` per round; the acceptance maths
is `proxy.sampling` (pure functions of the distributions), and what K to draft next is the
request's policy. When the drafter finds nothing worth verifying, the target decodes a chunk
plainly instead of verifying an empty draft, and the loop looks again. It calls nothing above it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from proxy.decode.events import RoundEvent, SwitchEvent
from proxy.decode.plain import plain_chunk, plain_tokens
from proxy.decode.session import Session
from proxy.drafting.base import Draft, Drafter
from proxy.sampling.candidates import verify_candidates
from proxy.sampling.processors import one_hot
from proxy.sampling.rejection import verify_on_support
from proxy.targets.base import Target


async def speculative_tokens(session: Session, drafter: Drafter, target: Target) -> AsyncIterator[list[int]]:
    """Yield each round's emitted tokens; continue by plain decoding when the policy says K = 0."""
    context = list(session.prompt_ids)
    produced, index, worst_tv = 0, 0, 0.0
    is_end = drafter.vocabulary.is_end_of_generation
    while produced < session.max_tokens:
        remaining = session.max_tokens - produced
        decision = session.policy.next_k()
        # K = 0 ends speculation for a model draft; a lookup drafter goes on, in plain chunks where
        # nothing is worth verifying. Plain decoding is exact and always allowed.
        if (decision.k == 0 and not drafter.looks_up) or worst_tv > session.max_tv:
            reason = decision.reason if decision.k == 0 else f"error bound {worst_tv:.3g} above max_tv"
            session.publish(SwitchEvent(session.request_id, session.route, reason))
            async for tokens in plain_tokens(session, target, context, remaining):
                yield tokens
            return
        # A round emits up to k + 1 tokens; the last round still drafts one so every token goes
        # through the sampler. Cutting a round's output short keeps it exact (each prefix follows
        # the target's distribution).
        cap = max(remaining - 1, 1)
        started = time.perf_counter()
        plan = session.draft_plan(min(decision.k, cap), cap)
        draft = await drafter.propose(context, plan)
        drafted_at = time.perf_counter()
        if not draft.tokens:
            tokens = await plain_chunk(session, target, context, min(session.policy.plain_chunk(), remaining),
                                       lookup_missed=True, declined=draft.declined)
            emitted = _until_end(tuple(tokens), is_end)
        else:
            emitted, accepted, followed, tv_bound = await _verify(session, target, context, draft)
            emitted = _until_end(emitted[:remaining], is_end)
            worst_tv = max(worst_tv, tv_bound)
            asked = plan.k if draft.source == "model" else plan.lookup_k
            session.publish(RoundEvent(session.request_id, session.route, index, asked, followed, accepted,
                                       emitted, drafted_at - started, time.perf_counter() - drafted_at, tv_bound,
                                       draft.source, 1 + len(draft.alternatives), draft.declined))
            index += 1
        if not emitted:
            return
        produced += len(emitted)
        yield list(emitted)
        if is_end(emitted[-1]):
            return
        context.extend(emitted)


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
