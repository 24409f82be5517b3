"""The local llama.cpp draft model: propose K tokens after a context, with their draft distributions.

Its KV cache persists across rounds. Rejected drafts are rolled back, not re-evaluated: the next
`propose` shares the accepted prefix with what was evaluated, and the engine drops only the
suffix that differs (see `LlamaEngine.evaluate`). Concurrent requests are serialized on one
llama.cpp sequence; switching requests is the same prefix logic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from proxy.engine.llama import EngineOptions, LlamaEngine

from proxy.engine.runner import EngineRunner
from proxy.sampling.rejection import sample
from proxy.sampling.processors import SamplerOrder, SamplingParams, processed_probs, truncate_to_top


@dataclass(frozen=True)
class Draft:
    """K drafted tokens and the distribution each was drawn from."""

    tokens: tuple[int, ...]  # [k]
    probs: np.ndarray  # [k, vocab] float64: the exact distribution each token was sampled from,
    # truncated to the draft's top candidates so the target can be asked about every one of them

    def __len__(self) -> int:
        return len(self.tokens)


class DraftModel:
    """A GGUF draft model behind one async method."""

    def __init__(self, runner: EngineRunner) -> None:
        self._runner = runner
        self.engine = runner.engine

    @classmethod
    def load(cls, options: EngineOptions) -> DraftModel:
        """Load a GGUF as a draft model (blocking: call at start-up)."""
        return cls(EngineRunner(LlamaEngine(options)))

    async def propose(self, context: Sequence[int], k: int, params: SamplingParams, order: SamplerOrder,
                      support_size: int, rng: np.random.Generator) -> Draft:
        """Draft up to k tokens after context (fewer if the draft ends generation)."""
        async with self._runner.lock:
            return await self._runner.run(self._propose, list(context), k, params, order, support_size, rng)

    def _propose(self, context: list[int], k: int, params: SamplingParams, order: SamplerOrder,
                 support_size: int, rng: np.random.Generator) -> Draft:
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        for _ in range(k):
            logits = self.engine.evaluate(context, len(context) - 1).logits[0]
            probs = truncate_to_top(processed_probs(logits, params, order), support_size)
            token = sample(probs, rng)
            tokens.append(token)
            rows.append(probs)
            context.append(token)
            if self.engine.is_end_of_generation(token):
                break
        probs = np.stack(rows) if rows else np.zeros((0, self.engine.n_vocab))
        return Draft(tuple(tokens), probs)

    def fits(self, n_tokens: int) -> bool:
        """Whether a context of n_tokens (plus a round of drafts) fits the draft's context."""
        return n_tokens < self.engine.n_ctx

    def close(self) -> None:
        """Free the model."""
        self._runner.close()
