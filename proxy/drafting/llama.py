"""The llama.cpp draft model: propose K tokens after a context, with their draft distributions.

Its KV cache persists across rounds. Rejected drafts are rolled back, not re-evaluated: the next
`propose` shares the accepted prefix with what was evaluated, and the engine drops only the
suffix that differs (see `LlamaEngine.evaluate`). Concurrent requests are serialized on one
llama.cpp sequence; switching requests is the same prefix logic.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from proxy.drafting.base import Draft, DraftPlan
from proxy.engine.llama import EngineOptions, LlamaEngine
from proxy.engine.runner import EngineRunner
from proxy.sampling.processors import processed_probs, truncate_to_top
from proxy.sampling.rejection import sample


class LlamaDrafter:
    """A GGUF draft model behind one async method; its engine thread and lock are private."""

    def __init__(self, engine: LlamaEngine) -> None:
        self._runner = EngineRunner(engine)
        self._engine = engine
        self.vocabulary = engine

    @classmethod
    def load(cls, options: EngineOptions) -> LlamaDrafter:
        """Load a GGUF as a draft model (blocking: call at start-up)."""
        return cls(LlamaEngine(options))

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        """Draft up to plan.k tokens after context (fewer if the draft ends generation)."""
        async with self._runner.lock:
            return await self._runner.run(self._propose, list(context), plan)

    def _propose(self, context: list[int], plan: DraftPlan) -> Draft:
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        for _ in range(plan.k):
            logits = self._engine.evaluate(context, len(context) - 1).logits[0]
            probs = truncate_to_top(processed_probs(logits, plan.params, plan.order), plan.support_size)
            token = sample(probs, plan.rng)
            tokens.append(token)
            rows.append(probs)
            context.append(token)
            if self._engine.is_end_of_generation(token):
                break
        probs = np.stack(rows) if rows else np.zeros((0, self._engine.n_vocab))
        return Draft(tuple(tokens), probs)

    def fits(self, n_tokens: int) -> bool:
        """Whether a context of n_tokens (plus a round of drafts) fits the draft's context."""
        return n_tokens < self._engine.n_ctx

    def close(self) -> None:
        """Stop the engine thread and free the model."""
        self._runner.close()
