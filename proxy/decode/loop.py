"""The round loop: propose -> score -> accept -> publish, until max_tokens or the end of generation.

The loop does the I/O of a round and publishes one `RoundEvent` per round; the acceptance maths
is `proxy.sampling.rejection`, a pure function of the two distributions, and what K to draft next
is the request's policy. It calls nothing above it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

from proxy.decode.events import RoundEvent, SwitchEvent
from proxy.decode.plain import plain_tokens
from proxy.decode.session import Session
from proxy.drafting.base import Drafter
from proxy.sampling.rejection import verify_on_support
from proxy.targets.base import Target


async def speculative_tokens(session: Session, drafter: Drafter, target: Target) -> AsyncIterator[list[int]]:
    """Yield each round's emitted tokens; continue by plain decoding when the policy says K = 0."""
    context = list(session.prompt_ids)
    produced, index, worst_tv = 0, 0, 0.0
    while produced < session.max_tokens:
        remaining = session.max_tokens - produced
        decision = session.policy.next_k()
        if decision.k == 0 or worst_tv > session.max_tv:  # plain decoding is exact and always allowed
            reason = decision.reason if decision.k == 0 else f"error bound {worst_tv:.3g} above max_tv"
            session.publish(SwitchEvent(session.request_id, session.route, reason))
            async for tokens in plain_tokens(session, target, context, remaining):
                yield tokens
            return
        # A round emits up to k + 1 tokens; the last round still drafts one so every token goes
        # through the sampler. Cutting a round's output short keeps it exact (each prefix follows
        # the target's distribution).
        k = min(decision.k, max(remaining - 1, 1))
        started = time.perf_counter()
        draft = await drafter.propose(context, session.draft_plan(k))
        drafted_at = time.perf_counter()
        scores = await target.score(context, draft, session.score_plan())
        verified_at = time.perf_counter()
        result = verify_on_support(draft.tokens, scores.support, session.random.accept)
        emitted = _until_end(result.emitted[:remaining], drafter.vocabulary.is_end_of_generation)
        worst_tv = max(worst_tv, scores.tv_bound)
        session.publish(RoundEvent(session.request_id, session.route, index, k, draft.tokens, result.accepted,
                                   emitted, drafted_at - started, verified_at - drafted_at, scores.tv_bound))
        produced += len(emitted)
        index += 1
        yield list(emitted)
        if emitted and drafter.vocabulary.is_end_of_generation(emitted[-1]):
            return
        context.extend(emitted)


def _until_end(tokens: tuple[int, ...], is_end: Callable[[int], bool]) -> tuple[int, ...]:
    """The tokens up to and including the first end of generation (a draft may run past it)."""
    for position, token in enumerate(tokens):
        if is_end(token):
            return tokens[: position + 1]
    return tokens
