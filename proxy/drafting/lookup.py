"""Prompt-lookup drafting: propose what followed the most recent earlier occurrence of the context's tail.

No model runs: it costs microseconds, which is what makes speculation pay on CPUs and for
input-grounded work (editing, extraction) where the output copies the prompt. The draft is
deterministic, so its distribution is one-hot: the target accepts d with probability p(d) and on
rejection samples p with d removed — the same exact verification as model drafts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from proxy.drafting.base import Draft, Drafter, DraftPlan
from proxy.sampling.processors import one_hot


def lookup(context: Sequence[int], k: int, *, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to k tokens that followed the latest earlier match of the longest matching tail n-gram."""
    tokens = np.asarray(context, dtype=np.int64)
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        tail = tokens[-n:]
        # Every start position s < len - n whose n tokens equal the tail; the latest one wins.
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        starts = np.flatnonzero((windows == tail).all(axis=1))
        if starts.size:
            start = int(starts[-1]) + n
            return tokens[start : start + k].tolist()
    return []


class LookupDrafter:
    """A draft with no model: prompt lookup only. The GGUF drafter it wraps serves as the tokenizer."""

    def __init__(self, tokenizer: Drafter, *, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self._tokenizer = tokenizer
        self.vocabulary = tokenizer.vocabulary
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def reserve(self, request_id: str, context: Sequence[int]) -> bool:
        """Lookup keeps no per-request state."""
        return True

    def release(self, request_id: str) -> None:
        """Nothing was held."""

    def occupancy(self) -> tuple[int, int] | None:
        """No sequences."""
        return None

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        """Draft by lookup (possibly nothing), with one-hot distributions."""
        tokens = tuple(lookup(context, plan.k, max_ngram=self.max_ngram, min_ngram=self.min_ngram))
        return Draft(tokens, one_hot(tokens, self.vocabulary.n_vocab))

    def fits(self, n_tokens: int) -> bool:
        """Lookup has no context limit; the tokenizer model does not run."""
        return True

    def close(self) -> None:
        """Free the tokenizer model."""
        self._tokenizer.close()


class HybridDrafter(LookupDrafter):
    """Prompt lookup when the context has a match, the draft model otherwise."""

    def reserve(self, request_id: str, context: Sequence[int]) -> bool:
        """The model's sequence."""
        return self._tokenizer.reserve(request_id, context)

    def release(self, request_id: str) -> None:
        """The model's sequence."""
        self._tokenizer.release(request_id)

    def occupancy(self) -> tuple[int, int] | None:
        """The model's sequences."""
        return self._tokenizer.occupancy()

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        """Lookup first; fall back to the model when lookup finds nothing."""
        found = await super().propose(context, plan)
        if len(found):
            return found
        return await self._tokenizer.propose(context, plan)

    def fits(self, n_tokens: int) -> bool:
        """The model's context limit applies."""
        return self._tokenizer.fits(n_tokens)
