"""The round loop: draft K tokens locally, verify them remotely in one call, accept locally, emit.

This module does the I/O of a round and keeps the statistics; the acceptance maths is
`proxy.sampling.verify`, a pure function of the two distributions.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np

from proxy.drafting.llama import Draft, DraftModel
from proxy.sampling.rejection import KnownSupport, verify_on_support
from proxy.sampling.processors import SamplerOrder, SamplingParams
from proxy.targets.base import Target
from proxy.targets.topn import support_from_top_n


@dataclass
class RoundStats:
    """What a generation's rounds did, for logs, metrics and the response extension."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    round_trace: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per round
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    max_tv_bound: float = 0.0  # bounded sampling: the largest per-token total-variation bound seen
    switched_to_plain: bool = False  # the generation was continued by plain decoding mid-stream
    plain_tokens: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        """α: accepted draft tokens ÷ drafted tokens."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_round(self) -> float | None:
        """τ: tokens emitted per round."""
        return self.emitted / self.rounds if self.rounds else None

    def record(self, drafted: int, accepted: int, emitted: int) -> None:
        """Add one round."""
        self.rounds += 1
        self.round_trace.append((drafted, accepted))
        self.drafted += drafted
        self.accepted += accepted
        self.emitted += emitted
        while len(self.accepted_per_position) < accepted:
            self.accepted_per_position.append(0)
        for position in range(accepted):
            self.accepted_per_position[position] += 1

    def as_dict(self) -> dict[str, float | int | None]:
        """The JSON extension object."""
        alpha, tau = self.acceptance_rate, self.tokens_per_round
        return {
            "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
            "alpha": round(alpha, 4) if alpha is not None else None,
            "tokens_per_round": round(tau, 3) if tau is not None else None,
            "draft_ms": round(self.draft_seconds * 1000, 1), "verify_ms": round(self.verify_seconds * 1000, 1),
            "max_tv_bound": round(self.max_tv_bound, 6),
            "switched_to_plain": self.switched_to_plain, "plain_tokens": self.plain_tokens,
            "round_trace": [list(r) for r in self.round_trace],
        }


@dataclass(frozen=True)
class RoundPlan:
    """Fixed inputs of one generation's rounds."""

    k: int
    params: SamplingParams
    order: SamplerOrder  # the target's sampler order; the draft samples the same way
    top_n: int  # candidates per position: the target's top-N, and the draft's support size
    client_headers: dict[str, str] | None = None
    max_tv: float = 0.0  # bounded sampling: a round whose error bound exceeds this ends speculation


async def score_round(target: Target, context: list[int], proposal: Draft, plan: RoundPlan,
                      rng: np.random.Generator) -> tuple[KnownSupport, float]:
    """One verification call, folded into what the sampler needs, with the round's error bound."""
    if target.exact_support:
        seed = int(rng.integers(2**63))  # the verifier's draws are reproducible from the request's seed
        support = await target.verify_support(context, proposal.tokens, proposal.probs, plan.params, seed,
                                              plan.client_headers)
        return support, 0.0
    verification = await target.verify(context, list(proposal.tokens), plan.top_n, plan.client_headers)
    return support_from_top_n(verification, proposal.tokens, proposal.probs, plan.params, plan.order)


PLAIN_CHUNK = 8  # tokens per plain-decoding call after a mid-stream switch


@dataclass
class RoundHooks:
    """How the loop asks for each round's K and reports what happened (the route's controller and metrics)."""

    next_k: Callable[[int], int] = lambda rounds_done: -1  # -1: the plan's k; 0: switch to plain decoding
    # k, accepted, draft seconds, verify seconds, and whether the round is warm (not the first, which
    # also pays the prompt's prefill on both sides and would bias the per-token costs)
    on_round: Callable[[int, int, float, float, bool], None] = lambda k, accepted, draft_s, verify_s, warm: None
    on_plain: Callable[[int, float], None] = lambda tokens, seconds: None


async def speculative_tokens(
    draft: DraftModel, target: Target, prompt_ids: list[int], max_tokens: int, plan: RoundPlan,
    rng: np.random.Generator, stats: RoundStats, hooks: RoundHooks | None = None,
) -> AsyncIterator[list[int]]:
    """Yield each round's emitted tokens until max_tokens or the end of generation."""
    hooks = hooks or RoundHooks()
    context = list(prompt_ids)
    produced = 0
    while produced < max_tokens:
        chosen = hooks.next_k(stats.rounds)
        if chosen == 0 or stats.max_tv_bound > plan.max_tv:  # plain decoding is exact and always allowed
            stats.switched_to_plain = True
            async for tokens in plain_tokens(target, context, max_tokens - produced, plan, rng, stats, hooks):
                yield tokens
            return
        # A round emits up to k + 1 tokens; the last round still drafts one so every token goes
        # through the sampler. Cutting a round's output short keeps it exact (each prefix follows
        # the target's distribution).
        remaining = max_tokens - produced
        k = min(plan.k if chosen < 0 else chosen, max(remaining - 1, 1))
        started = time.perf_counter()
        proposal = await draft.propose(context, k, plan.params, plan.order, plan.top_n, rng)
        drafted_at = time.perf_counter()
        support, bound = await score_round(target, context, proposal, plan, rng)
        draft_s, verify_s = drafted_at - started, time.perf_counter() - drafted_at
        stats.draft_seconds += draft_s
        stats.verify_seconds += verify_s
        stats.max_tv_bound = max(stats.max_tv_bound, bound)
        result = verify_on_support(proposal.tokens, support, rng)
        hooks.on_round(len(proposal), result.accepted, draft_s, verify_s, stats.rounds > 0)
        emitted = list(result.emitted)[:remaining]
        stats.record(len(proposal), result.accepted, len(emitted))
        produced += len(emitted)
        yield emitted
        if any(draft.engine.is_end_of_generation(t) for t in emitted):
            return
        context.extend(emitted)


async def plain_tokens(
    target: Target, context: list[int], remaining: int, plan: RoundPlan, rng: np.random.Generator,
    stats: RoundStats, hooks: RoundHooks,
) -> AsyncIterator[list[int]]:
    """Continue a generation by plain decoding on the target, a few tokens per call."""
    context = list(context)
    while remaining > 0:
        started = time.perf_counter()
        tokens = await target.generate(context, min(PLAIN_CHUNK, remaining), plan.params,
                                       int(rng.integers(2**63)), plan.client_headers)
        hooks.on_plain(len(tokens), time.perf_counter() - started)
        if not tokens:
            return
        stats.plain_tokens += len(tokens)
        yield tokens
        context.extend(tokens)
        remaining -= len(tokens)
