"""Drafts with no model: prompt lookup (the latest n-gram match), suffix lookup, and suffix lookup before a model.

No model runs: it costs microseconds, which is what makes speculation pay on CPUs and for
input-grounded work (editing, extraction) where the output copies the prompt. The draft is
deterministic, so its distribution is one-hot: the target accepts d with probability p(d) and on
rejection samples p with d removed — the same exact verification as model drafts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import replace

import numpy as np

from proxy.drafting.base import Draft, Drafter, DraftPlan, InFront, Source
from proxy.drafting.edits import OutputEdits, in_prompt_words, replay
from proxy.drafting.suffix import MAX_MATCH, Continuation, LookupSettings, OutputHistory, ScopedHistory, continuations
from proxy.sampling.draft_rows import DraftRows


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
    """A draft with no model: prompt lookup only. The GGUF drafter it wraps (`_inner`) serves as the tokenizer (and
    as the hybrid's model)."""

    def __init__(self, tokenizer: Drafter, *, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self._inner = tokenizer
        self.vocabulary = tokenizer.vocabulary
        self.looks_up = True
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def reserve(self, request_id: str, context: Sequence[int], *, tenant: str = "") -> bool:
        """Lookup keeps no per-request state."""
        return True

    def release(self, request_id: str) -> None:
        """Nothing was held."""

    def occupancy(self) -> tuple[int, int] | None:
        """No sequences."""
        return None

    def prefill(self, request_id: str, context: Sequence[int]) -> Awaitable[None] | None:
        """Lookup reads nothing ahead."""
        return None

    def read(self, request_id: str, context: Sequence[int], tokens: Sequence[int]) -> Awaitable[list[int]] | None:
        """No model to read with."""
        return None

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        """Draft by lookup (possibly nothing), with one-hot distributions."""
        tokens = tuple(lookup(context, plan.lookup_k or plan.k, max_ngram=self.max_ngram, min_ngram=self.min_ngram))
        return Draft(tokens, DraftRows.one_hot(tokens, self.vocabulary.n_vocab))

    def fits(self, n_tokens: int) -> bool:
        """Lookup has no context limit; the tokenizer model does not run."""
        return True

    def close(self) -> None:
        """Free the tokenizer model."""
        self._inner.close()


ROUTE_SCOPE = "route"  # the one history scope of a route that shares its outputs across tenants


class _Reserved:
    """What a suffix drafter keeps of one request: its prompt, whose history it reads and joins, the latest context
    it drafted after, and its output's changes to the prompt."""

    def __init__(self, prompt: Sequence[int], scope: str) -> None:
        self.prompt = np.asarray(prompt, dtype=np.int64)
        self.scope = scope
        self.context = prompt
        self.edits = OutputEdits(prompt)


class SuffixDrafter(LookupDrafter):
    """Suffix lookup over the request's own context and, unless kept apart, recent outputs of the same tenant
    (or, `per_tenant` off, of the whole route); where the output copies its prompt with changes, the prompt's
    continuation with those changes made. A request that reserved nothing sees no one's outputs."""

    def __init__(self, tokenizer: Drafter, settings: LookupSettings, *, history_tokens: int = 0,
                 per_tenant: bool = True) -> None:
        super().__init__(tokenizer)
        self.settings = settings
        self.history = ScopedHistory(history_tokens) if history_tokens > 0 else None
        self.per_tenant = per_tenant
        self._requests: dict[str, _Reserved] = {}

    def reserve(self, request_id: str, context: Sequence[int], *, tenant: str = "") -> bool:
        """Remember the prompt and whose history the request reads and joins."""
        self._requests[request_id] = _Reserved(context, tenant if self.per_tenant else ROUTE_SCOPE)
        return True

    def release(self, request_id: str) -> None:
        """Add the request's output to its scope's history."""
        reserved = self._requests.pop(request_id, None)
        if self.history is not None and reserved is not None:
            self.history.add(reserved.scope, list(reserved.context[reserved.prompt.size:]))

    def _history(self, request_id: str) -> OutputHistory | None:
        """The outputs this request may draft from."""
        reserved = self._requests.get(request_id)
        return None if self.history is None or reserved is None else self.history.get(reserved.scope)

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        """The best path (trimmed to what is worth verifying) and its branches, one-hot; possibly nothing."""
        if (reserved := self._requests.get(plan.request_id)) is not None:
            reserved.context = context
        paths, declined, beyond, match = self.paths(context, plan)
        if not paths:
            return Draft((), DraftRows.one_hot((), self.vocabulary.n_vocab), Source.LOOKUP, declined=declined,
                         match=match)
        best, *alternatives = paths
        return Draft(best, DraftRows.one_hot(best, self.vocabulary.n_vocab), Source.LOOKUP, tuple(alternatives),
                     beyond=beyond, match=match)

    def paths(self, context: Sequence[int],
              plan: DraftPlan) -> tuple[list[tuple[int, ...]], tuple[int, ...], int | None, int]:
        """Lookup paths worth verifying, best first (the first from the better of context and history); the best
        path when it was found but not worth verifying; the best path's token after the part worth it; and how many
        context tokens the best path matched (0: none found)."""
        settings = replace(self.settings, max_tokens=min(self.settings.max_tokens, plan.lookup_k or plan.k))
        query = np.asarray(context, dtype=np.int64)
        found = continuations(query, query, settings)
        history = self._history(plan.request_id)
        # A path as long as allowed and sure at every token scores the most any path can: the history cannot beat it.
        if history is not None and not (found and found[0].score >= settings.max_tokens):
            shared = continuations(history.corpus(), query, settings)
            if shared and (not found or shared[0].score > found[0].score):
                history.touch(shared[0].anchor)
                found = shared
        edited = self._edited(context, plan.request_id, settings)
        if edited is not None and (not found or edited.match_length >= found[0].match_length):
            found = [edited, *found][: settings.candidates]  # the copy with its changes; the plain path a branch
        paths: list[tuple[int, ...]] = []
        beyond = None
        match = found[0].match_length if found else 0
        for path in found:
            length = plan.worth(path.probs, path.match_length) if plan.worth is not None else len(path.tokens)
            if length > 0 and path.tokens[:length] not in paths:
                if not paths and length < len(path.tokens):
                    beyond = path.tokens[length]
                paths.append(path.tokens[:length])
            elif not paths:
                return [], path.tokens, None, match  # the best path was not worth verifying: nor are its branches
        return paths, (), beyond, match

    def _edited(self, context: Sequence[int], request_id: str, settings: LookupSettings) -> Continuation | None:
        """The prompt's continuation from where the output's copy of it stands, with the output's changes made;
        None while the output has made no change that could repeat."""
        reserved = self._requests.get(request_id)
        if reserved is None or not reserved.prompt.size:
            return None
        edits = reserved.edits.learn(context[reserved.prompt.size:])
        if not edits:
            return None
        tail, unfinished = in_prompt_words(context[-MAX_MATCH:], edits)
        found = continuations(reserved.prompt, np.asarray(tail, dtype=np.int64), replace(settings, candidates=1))
        if not found:
            return None
        path = found[0]
        tokens, origins = replay(path.tokens, edits)
        probs = [path.probs[0]] * len(unfinished) + [path.probs[i] for i in origins]
        tokens = [*unfinished, *tokens][: settings.max_tokens]
        return Continuation(tuple(tokens), tuple(probs[: len(tokens)]), path.match_length, path.anchor)


class HybridDrafter(InFront, SuffixDrafter):
    """Suffix lookup when a path is worth verifying, the draft model otherwise (decided every round)."""

    def reserve(self, request_id: str, context: Sequence[int], *, tenant: str = "") -> bool:
        """The model's sequence (and the prompt's length and the tenant, for the history)."""
        # SuffixDrafter's by name: InFront comes first in the order of bases, so super() would be the model's alone
        return self._inner.reserve(request_id, context) and SuffixDrafter.reserve(self, request_id, context,
                                                                                   tenant=tenant)

    def release(self, request_id: str) -> None:
        """The model's sequence; the output joins the history."""
        SuffixDrafter.release(self, request_id)
        self._inner.release(request_id)

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        """Lookup first; the model when lookup finds nothing worth verifying (and the model's K is not 0)."""
        found = await super().propose(context, plan)
        if len(found) or plan.k == 0:
            return found
        return replace(await self._inner.propose(context, plan), declined=found.declined, match=found.match)
