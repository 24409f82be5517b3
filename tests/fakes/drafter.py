"""Drafters for unit tests: a scripted one (the tokens a test chooses) and one that samples a toy model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from proxy.drafting.base import Draft, DraftPlan
from proxy.sampling.processors import one_hot, truncate_to_top
from proxy.sampling.rejection import sample
from tests.fakes.toy_model import ToyModel, ToyVocabulary

Script = Callable[[Sequence[int], int], Sequence[int]]  # (context, k) -> the tokens to propose


class _Stateless:
    """What a test drafter needs beyond `propose`: no sequences, no context limit, nothing to free."""

    looks_up = False

    def reserve(self, request_id: str, context: Sequence[int], *, tenant: str = "") -> bool:
        return True

    def release(self, request_id: str) -> None:
        pass

    def occupancy(self) -> None:
        return None

    def fits(self, n_tokens: int) -> bool:
        return True

    def prefill(self, request_id: str, context: Sequence[int]) -> None:
        return None

    def read(self, request_id: str, context: Sequence[int], tokens: Sequence[int]) -> None:
        return None

    def close(self) -> None:
        pass


class ScriptedDrafter(_Stateless):
    """Proposes what its script says, as one-hot drafts (like prompt lookup); records each call."""

    def __init__(self, script: Script) -> None:
        self.vocabulary = ToyVocabulary()
        self.script = script
        self.calls: list[tuple[int, int]] = []  # (context length, k)

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        self.calls.append((len(context), plan.k))
        k = plan.lookup_k if self.looks_up else plan.k  # a lookup drafter's paths follow lookup_k
        tokens = tuple(self.script(context, k))[:k]
        return Draft(tokens, one_hot(tokens, self.vocabulary.n_vocab))


class ToyDrafter(_Stateless):
    """Samples from a toy model (another seed than the target's: a draft that is sometimes wrong)."""

    def __init__(self, model: ToyModel) -> None:
        self.vocabulary = ToyVocabulary()
        self.model = model

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        context, tokens, rows = list(context), [], []
        for _ in range(plan.k):
            probs = truncate_to_top(self.model.probs(context, plan.params, plan.order), plan.support_size)
            token = sample(probs, plan.rng)
            tokens.append(token)
            rows.append(probs)
            context.append(token)
        return Draft(tuple(tokens), np.stack(rows) if rows else np.zeros((0, self.model.vocab)))
