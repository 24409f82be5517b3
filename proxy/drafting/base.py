"""The Drafter protocol: propose K tokens after a context, with the distribution each was drawn from.

Every drafter (the llama.cpp model, prompt lookup, both) answers one async call; blocking engines
and their locks stay private to the drafter that owns them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np

from proxy.sampling.draft_rows import DraftRows
from proxy.sampling.processors import SamplerOrder, SamplingParams


class Source(StrEnum):
    """What drafted a round's tokens (named so in round events and the response's figures)."""

    MODEL = "model"  # the draft model sampled them, token by token
    LOOKUP = "lookup"  # a path found in the context or the history
    PREDICTION = "prediction"  # the client's Predicted Output


@dataclass(frozen=True)
class Draft:
    """K drafted tokens and the distribution each was drawn from."""

    tokens: tuple[int, ...]  # [k]
    # [k, vocab], held sparsely: the exact distribution each token was sampled from, truncated to the draft's top
    # candidates so the target can be asked about every one of them (a dense array given here is converted)
    probs: DraftRows
    source: Source = Source.MODEL
    alternatives: tuple[tuple[int, ...], ...] = ()  # more deterministic candidates, verified in the same round
    declined: tuple[int, ...] = ()  # a lookup path found but judged not worth verifying (the policy learns from it)
    beyond: int | None = None  # the path's next token where the policy cut it short (the policy learns from it too)
    match: int = 0  # context tokens the lookup path (or the declined one) matched before it (0: none, not known)
    led: int = 0  # leading tokens the model sampled before a deterministic path took over (an edit, then the copy)
    checked: bool = False  # the model read the path in one batched step and cut it where it would write otherwise
    # The model's time per drafted token, its reading of context it had not seen left out (None: not timed,
    # the round's draft time stands for it)
    seconds_per_token: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.probs, np.ndarray):  # frozen: the converted rows replace the array once, here
            object.__setattr__(self, "probs", DraftRows.from_dense(self.probs))

    def __len__(self) -> int:
        return len(self.tokens)


class Worth(Protocol):
    """How many tokens of a path to verify (0: none): its estimates, its match, and whether the client predicted it."""

    def __call__(self, probs: Sequence[float], match: int, *, predicted: bool = False) -> int: ...


@dataclass(frozen=True)
class DraftPlan:
    """What one round asks of a drafter."""

    k: int  # at most this many tokens
    params: SamplingParams
    order: SamplerOrder  # the target's sampler order; the draft samples the same way
    support_size: int  # candidates kept per position (the target is asked about each)
    rng: np.random.Generator  # the request's drafting stream
    request_id: str = ""  # whose sequence to draft in (drafters that keep per-request state)
    lookup_k: int = 0  # at most this many tokens for a lookup path (0: k)
    # How many of a lookup path's tokens are worth verifying, given the estimated probability that
    # the path is right up to each and how many context tokens it matched (0: none; a hybrid drafts with its
    # model instead). None: all.
    worth: Worth | None = None


class Vocabulary(Protocol):
    """The tokenizer side of a drafter's GGUF: what text streams and tokenizer checks need."""

    n_vocab: int
    # Ends of generation by llama.cpp's own rules (FIM separators, ordinary tokens that read like an end marker),
    # where servers that follow the HF generation config go on.
    llama_only_ends: frozenset[int]

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids for text."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token renders to."""
        ...

    def is_end_of_generation(self, token: int) -> bool:
        """True for EOS and end-of-turn tokens."""
        ...

    @property
    def special_ids(self) -> dict[str, int]:
        """BOS and EOS ids."""
        ...


class Drafter(Protocol):
    """What the round loop needs from a draft."""

    vocabulary: Vocabulary
    looks_up: bool  # proposes lookup paths (free): plain decoding is then decided round by round

    def reserve(self, request_id: str, context: Sequence[int], *, tenant: str = "") -> bool:
        """Hold what a request needs for its lifetime (a sequence); False when nothing is free. `tenant` (a digest
        of the client's key) says whose earlier outputs the request may draft from, for drafters that keep them."""
        ...

    def release(self, request_id: str) -> None:
        """Free what reserve() held."""
        ...

    def occupancy(self) -> tuple[int, int] | None:
        """(sequences in use, sequences) for drafters that hold one per request; None otherwise."""
        ...

    def prefill(self, request_id: str, context: Sequence[int]) -> Awaitable[None] | None:
        """Start reading context into the request's cache before its first draft (None: nothing to read)."""
        ...

    def read(self, request_id: str, context: Sequence[int], tokens: Sequence[int]) -> Awaitable[list[int]] | None:
        """Start reading tokens the target wrote after context: the draft's greedy choice at each (None: no model)."""
        ...

    async def propose(self, context: Sequence[int], plan: DraftPlan) -> Draft:
        """Up to plan.k tokens after context (fewer, even none, when the drafter has nothing better)."""
        ...

    def fits(self, n_tokens: int) -> bool:
        """Whether a context of n_tokens (plus a round of drafts) fits the drafter."""
        ...

    def close(self) -> None:
        """Free what the drafter holds."""
        ...


class InFront:
    """A drafter in front of another (`_inner`): sequences, reading and the context limit stay the inner one's;
    the drafter in front decides only what to propose."""

    _inner: Drafter

    def reserve(self, request_id: str, context: Sequence[int], *, tenant: str = "") -> bool:
        """The inner drafter's."""
        return self._inner.reserve(request_id, context, tenant=tenant)

    def release(self, request_id: str) -> None:
        """The inner drafter's."""
        self._inner.release(request_id)

    def occupancy(self) -> tuple[int, int] | None:
        """The inner drafter's sequences."""
        return self._inner.occupancy()

    def prefill(self, request_id: str, context: Sequence[int]) -> Awaitable[None] | None:
        """The inner drafter reads the context (its model, if any)."""
        return self._inner.prefill(request_id, context)

    def read(self, request_id: str, context: Sequence[int], tokens: Sequence[int]) -> Awaitable[list[int]] | None:
        """The inner drafter reads the tokens (its model, if any)."""
        return self._inner.read(request_id, context, tokens)

    def fits(self, n_tokens: int) -> bool:
        """The inner drafter's context limit."""
        return self._inner.fits(n_tokens)
