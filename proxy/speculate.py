"""The round loop: draft K tokens locally, verify them remotely in one call, accept locally, emit.

This module does the I/O of a round and keeps the statistics; the acceptance maths is
`proxy.sampling.verify`, a pure function of the two distributions.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from proxy.draft import DraftModel
from proxy.sampling import SamplerOrder, SamplingParams, one_hot, verify
from proxy.targets import Target, Verification


@dataclass
class RoundStats:
    """What a generation's rounds did, for logs, metrics and the response extension."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

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
        }


def target_probs_greedy(verification: Verification, vocab_size: int) -> np.ndarray:
    """The target's greedy distribution at each position: one-hot at its argmax."""  # -> [k + 1, vocab]
    return one_hot([p.argmax for p in verification.positions], vocab_size)


@dataclass(frozen=True)
class RoundPlan:
    """Fixed inputs of one generation's rounds."""

    k: int
    params: SamplingParams
    order: SamplerOrder
    top_n: int
    client_headers: dict[str, str] | None = None


async def speculative_tokens(
    draft: DraftModel, target: Target, prompt_ids: list[int], max_tokens: int, plan: RoundPlan,
    rng: np.random.Generator, stats: RoundStats,
) -> AsyncIterator[list[int]]:
    """Yield each round's emitted tokens until max_tokens or the end of generation."""
    context = list(prompt_ids)
    vocab = draft.engine.n_vocab
    produced = 0
    while produced < max_tokens:
        k = min(plan.k, max_tokens - produced - 1)  # a round emits up to k + 1 tokens
        started = time.perf_counter()
        proposal = await draft.propose(context, k, plan.params, plan.order, rng)
        drafted_at = time.perf_counter()
        verification = await target.verify(context, list(proposal.tokens), plan.top_n, plan.client_headers)
        stats.draft_seconds += drafted_at - started
        stats.verify_seconds += time.perf_counter() - drafted_at
        result = verify(np.array(proposal.tokens, dtype=np.int64), proposal.probs,
                        target_probs_greedy(verification, vocab), rng)
        emitted = list(result.emitted)
        stats.record(len(proposal), result.accepted, len(emitted))
        produced += len(emitted)
        yield emitted
        if any(draft.engine.is_end_of_generation(t) for t in emitted):
            return
        context.extend(emitted)
